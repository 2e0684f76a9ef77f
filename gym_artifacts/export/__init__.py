"""The post-run export: the engine (one resolution, receipts, locks, send), certify policy for a
live run, many runs' executors and where a run stands (``status``).

The public entry points are ``gym_artifacts.export_run`` and ``gym_artifacts.export_runs``.
"""

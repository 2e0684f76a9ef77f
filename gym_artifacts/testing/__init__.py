"""The backend contract suite: one set of tests run against every registered exporter.

``python -m gym_artifacts.testing [NAME ...]`` runs it (pytest required) against the named
backends, or every registered one; ``docs/plugins.md`` explains what each test asks.
"""

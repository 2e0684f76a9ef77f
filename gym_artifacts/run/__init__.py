"""The run model: a run's files and what they hold (artifacts, identities, coverage, journal,
receipts, run config, rollout spans), read the same way by the export, the live path and the report.
"""

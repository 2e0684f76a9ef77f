"""The generic core: errors, atomic files, JSON and YAML, config loading, secrets, locks.

Nothing here knows a run, a backend or an export; every other part of the package builds on it.
"""

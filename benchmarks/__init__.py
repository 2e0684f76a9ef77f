"""Performance harness: each figure next to a baseline measured in the same run, as a ratio.

Run ``python -m benchmarks`` from the repository root (``--tiny`` for a quick check of the
harness itself, ``--only NAME`` for one benchmark). Not run by pytest, except ``--tiny``.
"""

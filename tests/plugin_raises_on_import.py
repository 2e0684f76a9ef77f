"""A third-party backend module that fails while it is imported (tests/test_registry.py)."""

raise RuntimeError("this plugin's module fails at import")

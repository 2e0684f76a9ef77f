"""The built-in backends under a private import name, so no other ``exporters`` package can shadow them.

The repository keeps the backends in its top-level ``exporters/`` folder. A wheel maps that folder
here (``pyproject.toml``: ``[tool.hatch.build.targets.wheel.sources]``), so an installed
gym-artifacts ships no top-level ``exporters`` package at all. A source checkout (an editable
install, or tests run from the repository) has no backend modules next to this file: the
checkout's folder is then added to this package's search path. Entry points always name
``gym_artifacts._builtin_exporters.<module>``, whichever ``exporters`` comes first on ``sys.path``.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
_CHECKOUT_FOLDER = _HERE.parent.parent / "exporters"

# Only in a checkout: in a wheel the modules sit here, and the folder two levels up is
# site-packages, where ``exporters`` may be somebody else's package.
if not (_HERE / "local.py").exists() and (_HERE.parent.parent / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT_FOLDER))

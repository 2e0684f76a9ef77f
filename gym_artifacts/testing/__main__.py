"""``python -m gym_artifacts.testing [NAME ...] [-- PYTEST ARGS]``: the contract suite for these backends."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import pytest

    names, _, extra = " ".join(argv).partition("--") if "--" in argv else (" ".join(argv), "", "")
    if names.strip():
        os.environ["GYM_ARTIFACTS_CONTRACT"] = ",".join(names.split())
    suite = Path(__file__).with_name("contract.py")
    return int(pytest.main([str(suite), "-p", "no:cacheprovider", "-q", *extra.split()]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

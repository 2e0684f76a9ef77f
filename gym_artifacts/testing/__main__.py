"""``python -m gym_artifacts.testing [NAME ...] [-- PYTEST ARGS]``: the contract suite for these backends."""

from __future__ import annotations

import os
import sys
from pathlib import Path

EXIT_USAGE = 2  # an unknown backend name, or pytest's own usage error
USAGE = """usage: python -m gym_artifacts.testing [NAME ...] [-- PYTEST ARGS]

Runs the contract suite over the registered backends NAME (all of them when none is given);
arguments after -- go to pytest as they are (e.g. -- -k live -x)."""


def main(argv: list[str]) -> int:
    import pytest

    split = argv.index("--") if "--" in argv else len(argv)
    names, extra = argv[:split], argv[split + 1 :]  # pytest's arguments kept whole ("-k a and b")
    if {"-h", "--help"} & set(names):
        print(USAGE)
        return 0
    if names:
        os.environ["GYM_ARTIFACTS_CONTRACT"] = ",".join(names)
    suite = Path(__file__).with_name("contract.py")
    code = int(pytest.main([str(suite), "-p", "no:cacheprovider", "-q", *extra], plugins=[_NameCheck(names)]))
    return EXIT_USAGE if code == pytest.ExitCode.USAGE_ERROR else code


class _NameCheck:
    """Refuses unregistered names once pytest has loaded its ``-p`` plugins (a backend they
    register counts): one line, a usage error, no traceback."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def pytest_configure(self, config: object) -> None:
        import pytest

        from gym_artifacts.contract import registry
        from gym_artifacts.core.errors import GymArtifactsError

        try:
            registered = registry.discover()
        except GymArtifactsError as exc:  # two distributions register one name
            raise pytest.UsageError(str(exc)) from None
        unknown = sorted(set(self.names) - set(registered))
        if unknown:
            known = ", ".join(sorted(registered))
            raise pytest.UsageError(f"no registered exporter {', '.join(unknown)} (registered: {known})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

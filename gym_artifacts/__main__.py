"""``python -m gym_artifacts``: the same command as ``gym-artifacts``."""

import sys

from gym_artifacts.cli import main

if __name__ == "__main__":
    sys.exit(main())

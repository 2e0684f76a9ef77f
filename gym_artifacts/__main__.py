"""``python -m gym_artifacts``: the same command as ``gym-artifacts``."""

from gym_artifacts.cli import run

if __name__ == "__main__":
    run()

#!/usr/bin/env bash
# A real NeMo Gym 0.7.0 in a virtual environment of its own (.venv-nemo-gym), with gym-artifacts
# installed into it as a NeMo Gym user would: the tests that run `gym env start` / `gym eval run`
# for real (tests/test_nemo_gym_real.py) find it through GYM_ARTIFACTS_NEMO_GYM_VENV.
#
#   bash scripts/nemo_gym_env.sh            # prints the venv's path on its last line
#
# NeMo Gym needs Python >= 3.12 (it declares a newer 3.13 than pyenv has here; it runs, hence
# --ignore-requires-python). Its resolved set is left as pip resolves it: this project's
# constraints file is NOT forced onto it (it would move numpy, omegaconf, httpx), and gym-artifacts
# goes in with --no-deps after its own dependencies are checked (`pip check`). Idempotent: a
# second run finds its stamp files and installs nothing (well under a second).
set -euo pipefail
cd "$(dirname "$0")/.."

NEMO_GYM_VERSION=0.7.0
MLFLOW_VERSION=3.17.2
venv="$PWD/.venv-nemo-gym"
stamp="$venv/.nemo-gym-$NEMO_GYM_VERSION-mlflow-$MLFLOW_VERSION"

python_313() {  # the newest pyenv Python 3.13, else 3.12, else any python3.13 / python3.12 on PATH
  local root candidate
  if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root)
    for candidate in $(ls -d "$root"/versions/3.13* "$root"/versions/3.12* 2>/dev/null | sort -rV); do
      if [ -x "$candidate/bin/python3" ]; then echo "$candidate/bin/python3"; return; fi
    done
  fi
  for candidate in python3.13 python3.12; do
    if command -v "$candidate" >/dev/null 2>&1; then command -v "$candidate"; return; fi
  done
  echo "nemo_gym_env.sh: NeMo Gym needs Python >= 3.12 (none found in pyenv or on PATH)" >&2
  exit 2
}

export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  "$(python_313)" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --ignore-requires-python \
    "nemo-gym==$NEMO_GYM_VERSION" "mlflow==$MLFLOW_VERSION"
  touch "$stamp"
fi
# gym-artifacts itself (editable: the tests run this checkout's code), without touching NeMo Gym's
# set; then whatever it needs that NeMo Gym's set lacks, unpinned (pip keeps what is there).
# Again only when this checkout or its pyproject.toml changed (the entry points live there).
ours="$venv/.gym-artifacts-$(cat pyproject.toml <(pwd) | sha256sum | cut -c1-16)"
if [ ! -f "$ours" ]; then
  "$venv/bin/python" -m pip install -q --no-deps -e .
  "$venv/bin/python" -m pip install -q blake3 orjson ijson matplotlib tqdm nvidia-ml-py tensorboard
  "$venv/bin/python" -m pip check >&2 || echo "nemo_gym_env.sh: pip check reports conflicts (above)" >&2
  rm -f "$venv"/.gym-artifacts-*
  touch "$ours"
fi
echo "$venv"

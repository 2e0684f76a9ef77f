#!/usr/bin/env bash
# The one set-up + test script: README's second command and what CI runs (.ci/run calls it
# unchanged). On a fresh machine it installs everything the tests need, then runs pytest with this
# script's arguments:
#
#   bash scripts/test.sh                 # the whole suite (what CI runs)
#   bash scripts/test.sh -m "not slow"   # the quick subset (docs say what it leaves out)
#   bash scripts/test.sh tests/test_report.py -n 0 -x
#
# Exits non-zero when any step or any test fails. Running it again reuses both virtual
# environments (installing into them again is a no-op that takes seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium for the report's browser tests (Playwright drives it; no browser download).
if ! command -v chromium >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

python3 -m venv .venv-ci
# shellcheck disable=SC1091
source .venv-ci/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, with pip: its CPU build is on this machine's disk (uv does not look there), and a
# plain torch requirement would download CUDA. uv installs the rest in seconds instead of minutes;
# the constraints are a full lock, so uv and pip install the same releases (pip is the fallback).
pip install -q torch==2.13.0 uv==0.13.9
# Byte-compile at install (pip does by default, uv does not): where PYTHONDONTWRITEBYTECODE is set,
# as on this project's machines, every test subprocess would otherwise compile MLflow, W&B and
# Ray from source again (the suite ran 1.6x slower that way).
export UV_COMPILE_BYTECODE=1
install() {  # install [--python PY] ARGS...: uv, else pip
  if ! uv pip install -q "$@"; then
    echo "uv failed; installing with pip" >&2
    if [ "$1" = --python ]; then py=$2; shift 2; else py=python; fi
    "$py" -m pip install -q "$@"
  fi
}
install -c .ci/constraints.txt -e '.[all,test]'
# The example third-party backend, installed as a user would: the contract suite must cover it.
install -c .ci/constraints.txt ./examples/ledger_plugin
export GYM_ARTIFACTS_CONTRACT_REQUIRE=ledger
export HYPOTHESIS_PROFILE=ci  # the same generated examples on every run (tests/conftest.py)

# Phoenix's server cannot share a virtual environment with MLflow (graphql-core pins conflict):
# it gets its own, and the tests find its binary through GYM_ARTIFACTS_PHOENIX_BIN.
python3 -m venv .venv-phoenix
install --python .venv-phoenix/bin/python -c .ci/phoenix-constraints.txt arize-phoenix==20.26.1
export GYM_ARTIFACTS_PHOENIX_BIN="$PWD/.venv-phoenix/bin/phoenix"

# A real NeMo Gym 0.7.0 (Python >= 3.12) in a venv of its own, gym-artifacts installed into it as a
# user would: tests/test_nemo_gym_real.py runs `gym env start` / `gym eval run` from it. Seconds
# when it is already there (scripts/nemo_gym_env.sh keeps a stamp); its last line is the venv.
GYM_ARTIFACTS_NEMO_GYM_VENV="$(bash scripts/nemo_gym_env.sh | tail -n 1)"
export GYM_ARTIFACTS_NEMO_GYM_VENV

python -m compileall -q gym_artifacts exporters tests benchmarks examples

ruff check .
# The layering of docs/architecture.md (contracts in pyproject.toml; tests/test_architecture.py
# also shows each one fails on a planted violation).
lint-imports --no-cache
python -m pytest "$@"

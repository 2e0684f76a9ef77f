"""Write ``tests/fixtures/nemo-gym-0.7.0/observability/``: a real NeMo Gym 0.7.0 collection made
with its own CLI and ``observability_enabled: true`` (rollout lines with ``ng_trajectory`` /
``ng_perf``, the model calls captured under ``model_call_capture_dir``).

    .venv-ci/bin/python scripts/nemo_gym_observability_fixture.py   # after scripts/nemo_gym_env.sh

The same servers, stub model and ``gym eval run`` as tests/test_nemo_gym_real.py (5 tasks x 2
repeats, ``get_weather`` for the 3 "sf" prompts, no failure), no tracker. Nothing is edited but
local paths, replaced as the fixture README says (the run's folder -> ``<workdir>``, NeMo Gym's
site-packages -> ``<site-packages>``, the Python prefix -> ``<python>``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.chat_stub import ChatStub  # noqa: E402
from tests.nemo_gym_real import AGENT, NemoGymServers, nemo_gym_venv, site_packages  # noqa: E402

DEST = REPO / "tests" / "fixtures" / "nemo-gym-0.7.0" / "observability"


def scrub(text: str, replacements: list[tuple[str, str]]) -> str:
    for path, name in replacements:
        text = text.replace(path, name)
    return text


def main() -> None:
    venv = nemo_gym_venv()
    if venv is None:
        sys.exit("no NeMo Gym venv: run scripts/nemo_gym_env.sh first")
    root = Path(tempfile.mkdtemp(prefix="ng-obs-"))
    work = root / "run"
    capture = work / "model_calls"
    observability = ("+observability_enabled=true", f"+model_call_capture_dir={capture}")
    with ChatStub(failing=False) as model:
        servers = NemoGymServers(venv, root / "servers", model.url, extra=observability)
        (root / "servers").mkdir()
        servers.start()
        try:
            work.mkdir(exist_ok=True)
            sp = site_packages(venv)
            cmd = [
                str(venv / "bin" / "gym"), "eval", "run", "--no-serve", "--agent", AGENT,
                "--input", str(sp / "resources_servers/example_single_tool_call/data/example.jsonl"),
                "--output", str(work / "rollouts.jsonl"), "--num-repeats", "2",
                f"+head_server.port={servers.head_port}", *observability,
            ]  # fmt: skip
            proc = subprocess.run(cmd, cwd=work, env=servers.env, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
        finally:
            servers.stop()
    replacements = [(str(work), "<workdir>"), (str(sp), "<site-packages>"), (str(venv), "<python>")]
    shutil.rmtree(DEST, ignore_errors=True)
    for source in sorted(p for p in work.rglob("*") if p.is_file()):
        if source.relative_to(work).parts[0] in ("outputs", "results"):  # Hydra's logs, W&B's folder
            continue
        target = DEST / source.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.write_text(scrub(source.read_text(), replacements))
        except UnicodeDecodeError:
            shutil.copy2(source, target)
    shutil.rmtree(root, ignore_errors=True)
    for path in sorted(DEST.rglob("*")):
        print(path.relative_to(REPO), path.stat().st_size if path.is_file() else "")


if __name__ == "__main__":
    main()

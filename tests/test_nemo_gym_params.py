"""``params_from_files``: what a run without a saved config tells about itself, read with the
fast parser, gives what Python's own parser gives, whatever odd lines the rollouts hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.nemo_gym_params import params_from_files

NAMES = st.sampled_from(["agent_a", "agent_b", "é-agent", "\u2028"])
ROW = st.fixed_dictionaries(
    {},
    optional={
        "agent_ref": st.fixed_dictionaries({"name": NAMES}) | NAMES | st.integers(),
        "_ng_environment_server": NAMES | st.none(),
        "_ng_task_index": st.integers(0, 3)
        | st.sampled_from([10**400, "t", "1", 1.0, True, None, float("nan"), [1]]),
        "response": st.fixed_dictionaries({}, optional={"model": NAMES | st.integers()})
        | st.text(max_size=3),
        "reward": st.floats(allow_nan=True, allow_infinity=True),
    },
)
ODD = st.sampled_from(
    [
        "[1, 2]",
        "7",
        "{not json",
        '"\\ud800 lone surrogate"',
        '{"agent_ref": {"name": "agent_a"}, "deep": ' + "[" * 5000 + "]" * 5000 + "}",
        "",
    ]
)


def stdlib_params(lines: list[str]) -> dict[str, Any] | None:
    """The same params read with Python's ``json`` alone (the reference)."""
    from collections import Counter

    agents: Counter[str] = Counter()
    environments: Counter[str] = Counter()
    models: Counter[str] = Counter()
    per_task: Counter[str] = Counter()
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(row, dict):
            continue
        agent = row.get("agent_ref")
        agent = agent.get("name") if isinstance(agent, dict) else agent
        if isinstance(agent, str):
            agents[agent] += 1
        if isinstance(row.get("_ng_environment_server"), str):
            environments[row["_ng_environment_server"]] += 1
        response = row.get("response")
        model = response.get("model") if isinstance(response, dict) else None
        if isinstance(model, str):
            models[model] += 1
        if row.get("_ng_task_index") is not None:
            per_task[json.dumps([agent, row["_ng_task_index"]])] += 1

    def joined(counter: Counter[str]) -> str | None:
        return ",".join(v for v, _ in counter.most_common()) if counter else None

    params = {
        "agent_name": joined(agents),
        "environment_server": joined(environments),
        "policy_model_name": joined(models),
        "num_repeats": max(per_task.values()) if per_task else None,
    }
    return {k: v for k, v in params.items() if v is not None} or None


THREE_TASKS = [json.dumps({"agent_ref": {"name": "a"}, "_ng_task_index": t}) for t in (1, True, 1.0, "1")]


@settings(max_examples=60, deadline=None)
@example(lines=THREE_TASKS, torn=False)  # 1, true, 1.0 and "1" are four tasks: one rollout each
@given(lines=st.lists(ROW.map(json.dumps) | ODD, max_size=12), torn=st.booleans())
def test_params_match_pythons_parser_over_odd_lines(
    tmp_path_factory: Any, lines: list[str], torn: bool
) -> None:
    out = Path(tmp_path_factory.mktemp("run")) / "run.jsonl"
    text = "".join(line + "\n" for line in lines) + ('{"agent_ref": {"name": "torn"' if torn else "")
    out.write_text(text, encoding="utf-8", errors="surrogatepass")
    assert params_from_files(RunArtifacts.from_path(out)) == stdlib_params(lines)

"""Params for a NeMo Gym run exported after the fact, whose output folder holds no config.

NeMo Gym saves no config beside its rollouts. ``export --run-config FILE`` takes NeMo Gym's
resolved global config (YAML or JSON; what its own exporter logs as ``global_config.json``) and
logs all of it, masked, as NeMo Gym's exporter would (MLflow flattens it as NeMo Gym does:
``a.b``, ``a[0]``). Without one, the export logs what the files tell (``params_from_files``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from gym_artifacts.run import RunArtifacts

# What NeMo Gym's rollouts record, and the param each becomes (NeMo Gym's config names where
# it has one).
AGENT_PARAM = "agent_name"  # rollout["agent_ref"]["name"]
ENVIRONMENT_PARAM = "environment_server"  # rollout["_ng_environment_server"]
MODEL_PARAM = "policy_model_name"  # rollout["response"]["model"]
REPEATS_PARAM = "num_repeats"  # most rollouts of one task (_ng_task_index)


def load_nemo_gym_run_config(fpath: str | Path) -> tuple[dict[str, Any], frozenset[str]]:
    """NeMo Gym's resolved global config from ``fpath``, masked, and the secret values it held.

    Unlike a run's own saved config nothing is left out: NeMo Gym logs its exporter keys
    (``mlflow_tracking_uri``...) as params too. ConfigError when the file cannot be used.
    """
    from gym_artifacts.config import load_yaml_config, resolve_tolerant
    from gym_artifacts.secrets import collect_secret_values, mask_secrets, remember_secrets

    resolved = resolve_tolerant(load_yaml_config(fpath))  # JSON is YAML
    secrets = frozenset(collect_secret_values(resolved))
    remember_secrets(secrets)
    return mask_secrets(resolved, secrets), secrets


def _one_value(counter: Counter[str]) -> str | None:
    """The value, or the values joined by ``,`` (most frequent first) when rollouts differ."""
    if not counter:
        return None
    return ",".join(value for value, _ in counter.most_common())


def params_from_files(run: RunArtifacts) -> dict[str, Any] | None:
    """What a NeMo Gym run's rollouts tell about it: agent, environment server, model, repeats.

    None when the rollouts tell none of these (the run then has no params, as before). A line
    that is not a JSON object is skipped: the export's own checks report bad files.
    """
    fpath = run.rollouts_fpath
    if fpath is None or not fpath.is_file():
        return None
    agents: Counter[str] = Counter()
    environments: Counter[str] = Counter()
    models: Counter[str] = Counter()
    per_task: Counter[str] = Counter()
    with open(fpath, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # a torn last line is the export's to report
            try:
                row = orjson.loads(line)  # several times json's speed: this reads every rollout
            except orjson.JSONDecodeError:
                try:  # what orjson refuses and json reads (NaN, integers beyond 64 bits)
                    row = json.loads(line)
                except ValueError:
                    continue
            if not isinstance(row, dict):
                continue
            agent = row.get("agent_ref")
            agent = agent.get("name") if isinstance(agent, dict) else agent
            if isinstance(agent, str):
                agents[agent] += 1
            environment = row.get("_ng_environment_server")
            if isinstance(environment, str):
                environments[environment] += 1
            response = row.get("response")
            model = response.get("model") if isinstance(response, dict) else None
            if isinstance(model, str):
                models[model] += 1
            task = row.get("_ng_task_index")
            if task is not None:
                per_task[json.dumps([agent, task])] += 1
    params = {
        AGENT_PARAM: _one_value(agents),
        ENVIRONMENT_PARAM: _one_value(environments),
        MODEL_PARAM: _one_value(models),
        REPEATS_PARAM: max(per_task.values()) if per_task else None,
    }
    params = {k: v for k, v in params.items() if v is not None}
    return params or None

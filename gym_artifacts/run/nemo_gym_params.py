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

from gym_artifacts.run.artifacts import RunArtifacts

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
    from gym_artifacts.core.config import load_yaml_config, resolve_tolerant
    from gym_artifacts.core.secrets import collect_secret_values, mask_secrets, remember_secrets

    resolved = resolve_tolerant(load_yaml_config(fpath))  # JSON is YAML
    secrets = frozenset(collect_secret_values(resolved))
    remember_secrets(secrets)
    return mask_secrets(resolved, secrets), secrets


def _one_value(counter: Counter[str]) -> str | None:
    """The value, or the values joined by ``,`` (most frequent first) when rollouts differ."""
    if not counter:
        return None
    return ",".join(value for value, _ in counter.most_common())


def _task_key(agent: Any, task: Any) -> Any:
    """One key per (agent, task) as their JSON texts tell them apart (``1``, ``1.0`` and ``true``
    are three tasks): the common string or integer values as a typed tuple, the rest as JSON."""
    if type(task) in (str, int) and (agent is None or type(agent) is str):
        return (agent, type(task), task)
    return json.dumps([agent, task])


class ParamsTally:
    """What rollouts tell about their run, counted a record at a time: agents, environment
    servers, models, and rollouts per task (tallies of parts of a file merge). ``params()``
    gives the run's params (``params_from_files``)."""

    __slots__ = ("agents", "environments", "models", "per_task")

    def __init__(self) -> None:
        self.agents: Counter[str] = Counter()
        self.environments: Counter[str] = Counter()
        self.models: Counter[str] = Counter()
        self.per_task: Counter[Any] = Counter()

    def add(self, row: Any) -> None:
        """One record (anything but a JSON object tells nothing)."""
        if not isinstance(row, dict):
            return
        agent = row.get("agent_ref")
        agent = agent.get("name") if isinstance(agent, dict) else agent
        if isinstance(agent, str):
            self.agents[agent] += 1
        environment = row.get("_ng_environment_server")
        if isinstance(environment, str):
            self.environments[environment] += 1
        response = row.get("response")
        model = response.get("model") if isinstance(response, dict) else None
        if isinstance(model, str):
            self.models[model] += 1
        task = row.get("_ng_task_index")
        if task is not None:
            self.per_task[_task_key(agent, task)] += 1

    def merge(self, other: ParamsTally) -> None:
        self.agents.update(other.agents)
        self.environments.update(other.environments)
        self.models.update(other.models)
        self.per_task.update(other.per_task)

    def params(self) -> dict[str, Any] | None:
        """The params the records tell; None when they tell none."""
        params = {
            AGENT_PARAM: _one_value(self.agents),
            ENVIRONMENT_PARAM: _one_value(self.environments),
            MODEL_PARAM: _one_value(self.models),
            REPEATS_PARAM: max(self.per_task.values()) if self.per_task else None,
        }
        params = {k: v for k, v in params.items() if v is not None}
        return params or None


def params_from_files(run: RunArtifacts) -> dict[str, Any] | None:
    """What a NeMo Gym run's rollouts tell about it: agent, environment server, model, repeats.

    None when the rollouts tell none of these (the run then has no params, as before). A line
    that is not a JSON object is skipped: the export's own checks report bad files. A full read
    of the file: ``rollouts_facts.run_params`` answers from the export's one read instead.
    """
    fpath = run.rollouts_fpath
    if fpath is None or not fpath.is_file():
        return None
    tally = ParamsTally()
    with open(fpath, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # a torn last line is the export's to report
            try:
                row = orjson.loads(line)  # the fast parser; the rare line it refuses (NaN, a
            except orjson.JSONDecodeError:  # huge integer...) is read as Python reads it
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    continue
            tally.add(row)
    return tally.params()

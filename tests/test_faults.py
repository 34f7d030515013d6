"""Fault injection fires at its configured rate, deterministically, and is recorded in step info."""

from __future__ import annotations

import pytest

from simplan.envs.base import Action, Observation, StepResult, Task
from simplan.envs.toy import ToyEnv
from simplan.evaluation.faults import TRANSIENT_TEXT, FaultConfig, FaultyEnv, perturb_text, step_rng, wrap_faults


def _run(cfg: FaultConfig, episodes: int = 40, steps: int = 25) -> list[list[str | None]]:
    env = FaultyEnv(ToyEnv(), cfg)
    out = []
    for i, task in enumerate(ToyEnv().tasks("train", limit=episodes)):
        env.begin_episode(f"ep{i}")
        env.reset(task)
        kinds = []
        for _ in range(steps):
            kinds.append(env.step(Action.command("look")).info.get("fault"))
        out.append(kinds)
    return out


@pytest.mark.parametrize("kind,rate", [("transient", 0.2), ("perturb", 0.1), ("transient", 0.5)])
def test_fires_at_configured_rate(kind: str, rate: float) -> None:
    runs = _run(FaultConfig(**{kind: rate}, seed=3), episodes=80)
    flat = [k for ep in runs for k in ep]
    observed = sum(k == kind for k in flat) / len(flat)
    n = len(flat)  # 2000 steps: 4 standard errors of a binomial proportion
    assert abs(observed - rate) < 4 * (rate * (1 - rate) / n) ** 0.5 + 1e-9
    assert all(k in (None, kind) for k in flat)


def test_zero_rate_never_fires_and_passes_through() -> None:
    env = wrap_faults(ToyEnv(), FaultConfig())
    assert isinstance(env, ToyEnv)  # nothing to inject: no wrapper
    flat = [k for ep in _run(FaultConfig(), episodes=5) for k in ep]
    assert flat and all(k is None for k in flat)


def test_deterministic_per_seed_episode_step() -> None:
    cfg = FaultConfig(transient=0.3, perturb=0.2, seed=7)
    assert _run(cfg, episodes=10) == _run(cfg, episodes=10)
    assert _run(cfg, episodes=10) != _run(FaultConfig(transient=0.3, perturb=0.2, seed=8), episodes=10)
    assert step_rng(1, "a", 2).random() == step_rng(1, "a", 2).random()


def test_transient_does_not_execute_and_keeps_state() -> None:
    task = ToyEnv().tasks("dev", limit=1)[0]
    env = FaultyEnv(ToyEnv(), FaultConfig(transient=1.0))
    obs = env.reset(task)
    result = env.step(Action.command("go east"))
    assert result.info["fault"] == "transient"
    assert result.observation.text == TRANSIENT_TEXT and result.observation.error
    assert result.observation.valid_actions == obs.valid_actions
    assert env.env.pos == 0  # the action never reached the env
    assert env.counts["transient"] == 1


def test_perturb_executes_and_alters_text() -> None:
    task = ToyEnv().tasks("dev", limit=1)[0]
    plain, faulty = ToyEnv(), FaultyEnv(ToyEnv(), FaultConfig(perturb=1.0))
    plain.reset(task)
    faulty.reset(task)
    a = plain.step(Action.command("go east"))
    b = faulty.step(Action.command("go east"))
    assert b.info["fault"] == "perturb"
    assert faulty.env.pos == 1  # executed
    assert b.observation.text != a.observation.text
    assert (b.score, b.done, b.observation.valid_actions) == (a.score, a.done, a.observation.valid_actions)
    assert perturb_text("One. Two. Three.", step_rng(0, "x", 0)) != "One. Two. Three."


class _ToolEnv:
    """A minimal tool env: counts executed calls."""

    name = "tools"

    def __init__(self) -> None:
        self.executed = 0

    def tasks(self, fold, families=None, limit=None):
        return [Task(env="tools", task_id="t0", fold=fold)]

    def reset(self, task):
        return Observation(text="ready", tools=[{"name": "ls"}])

    def step(self, action):
        self.executed += 1
        return StepResult(Observation(text='{"result": "ok"}', tools=[{"name": "ls"}]))

    def expert_plan(self):
        return []

    def parse_action(self, text):
        return Action.tool_call(text)

    def close(self):
        pass


def test_tool_error_only_on_tool_calls() -> None:
    env = FaultyEnv(_ToolEnv(), FaultConfig(tool_error=1.0))
    env.reset(Task(env="tools", task_id="t0", fold="dev"))
    r = env.step(Action.tool_call("ls", {}))
    assert r.info["fault"] == "tool_error" and r.observation.error and '"error"' in r.observation.text
    assert env.env.executed == 0
    r = env.step(Action.command("look"))  # not a tool call: executed, no fault
    assert "fault" not in r.info and env.env.executed == 1


def test_config_validation_and_limits() -> None:
    with pytest.raises(ValueError, match="<= 1"):
        FaultConfig(transient=0.6, perturb=0.6)
    with pytest.raises(ValueError, match="unknown key"):
        FaultConfig.from_dict({"transiant": 0.1})
    runs = _run(FaultConfig(transient=1.0, max_per_episode=2, start_step=3), episodes=3, steps=10)
    for kinds in runs:
        assert kinds[:3] == [None] * 3 and sum(k is not None for k in kinds) == 2

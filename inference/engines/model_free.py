"""Model-free deciders: the env's own expert replayed, or a seeded random valid action. No model, no adapters.

    simplan eval --suite toy-dev --arms reactive --engine expert --out runs/eval/toy-expert   # a sanity run
    simplan run --env shop --arm reactive --engine random

They answer the planner's decider requests (inference/engines/base.py) from the real episode rather than from
the prompt: `Planner` binds such an engine to its env (`ModelFreeEngine.bind`), which returns a decider
for that env and the env wrapped in a `WatchedEnv` that tells the decider about each reset and step.

- `expert`: after each reset, `env.expert_plan()` (the plan from the reset state); the decider answers
  the plan's next action, counting the real steps taken since the reset (a step that failed still
  counts: the plan is replayed as written, as `simplan collect`'s expert policy does). Past the plan's
  end it answers `finish()` (tool envs) or the plan's last action.
- `random`: a uniformly random action from the observation's valid-action list; in a tool env without
  one, a random tool with arguments drawn from its JSON schema (strings are words of the observation or
  goal). Seeded per task (`seed` and the task id), so a rerun takes the same actions.

Both have only a `decider` adapter: they serve the reactive arm (which needs nothing else); an arm that
simulates is refused by the planner with a message naming the missing simulator adapter.
"""

from __future__ import annotations

import random
import re
from typing import Any

from simplan.envs.actions import render_action, tool_specs
from simplan.envs.base import Action, Env, Observation, StepResult, Task, action_key_of_text
from simplan.inference.engines.base import (
    Completion,
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
    ScoreResult,
)

UNCHOSEN_LOGPROB = -30.0  # the other candidates of a score request: far below the chosen one's 0.0


class WatchedEnv:
    """`env` with each reset and step reported to a decider; every other attribute is the env's own."""

    def __init__(self, env: Env, decider: ModelFreeDecider) -> None:
        self.env, self._decider = env, decider

    @property
    def name(self) -> str:
        return self.env.name

    def __getattr__(self, attr: str) -> Any:  # tasks, expert_plan, parse_action, close, optional attributes
        if attr == "env":
            raise AttributeError(attr)
        return getattr(self.env, attr)

    def reset(self, task: Task) -> Observation:
        obs = self.env.reset(task)
        self._decider.on_reset(self.env, task, obs)
        return obs

    def step(self, action: Action) -> StepResult:
        result = self.env.step(action)
        self._decider.on_step(result.observation)
        return result


class ModelFreeDecider:
    """An Engine for one planner: answers decider requests with `choose()` (subclasses), never a model."""

    adapters = ["decider"]
    tokenizer = None

    def __init__(self, usage: EngineUsage, seed: int = 0) -> None:
        self.usage, self.seed = usage, seed
        self.env: Env | None = None
        self.obs = Observation(text="")
        self.steps = 0

    def on_reset(self, env: Env, task: Task, obs: Observation) -> None:
        self.env, self.obs, self.steps = env, obs, 0

    def on_step(self, obs: Observation) -> None:
        self.obs, self.steps = obs, self.steps + 1

    def choose(self, candidates: list[str] | None) -> str:
        """The action text to answer now; `candidates`: the texts the request allows (None: any)."""
        raise NotImplementedError

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = []
        for req in requests:
            text = self.choose(req.choices)
            n_tokens = max(1, len(text.split()))
            completions = [Completion(text=text, num_tokens=n_tokens, logprob=0.0) for _ in range(req.n)]
            results.append(GenerationResult(completions, 0, n_tokens * req.n, 0.0))
        self._count(len(requests), sum(r.completion_tokens for r in results))
        return results

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        results = []
        for req in requests:
            chosen = self.choose(req.candidates)
            logprobs = [0.0 if c == chosen else UNCHOSEN_LOGPROB for c in req.candidates]
            results.append(ScoreResult(logprobs, [1] * len(req.candidates), 0, 0.0))
        self._count(len(requests), 0)
        return results

    def _count(self, requests: int, completion_tokens: int) -> None:
        self.usage.add(EngineUsage(calls=1, requests=requests, completion_tokens=completion_tokens))

    def _match(self, action: Action, candidates: list[str] | None) -> str:
        """`action` as one of `candidates` (the same `Action.key()`), else its rendering."""
        if candidates and self.env is not None:
            for c in candidates:
                if action_key_of_text(self.env, c) == action.key():
                    return c
        return render_action(action)

    def close(self) -> None:
        pass


class ExpertDecider(ModelFreeDecider):
    """Replays `env.expert_plan()` read right after each reset (module docstring)."""

    def on_reset(self, env: Env, task: Task, obs: Observation) -> None:
        super().on_reset(env, task, obs)
        self.plan = env.expert_plan()

    def choose(self, candidates: list[str] | None) -> str:
        if self.steps < len(self.plan):
            return self._match(self.plan[self.steps], candidates)
        after = Action(kind="finish") if self.obs.tools else self.plan[-1] if self.plan else Action.command("look")
        return self._match(after, candidates)


class RandomDecider(ModelFreeDecider):
    """A uniformly random valid action (or random tool call), seeded per task (module docstring)."""

    def on_reset(self, env: Env, task: Task, obs: Observation) -> None:
        super().on_reset(env, task, obs)
        self.rng = random.Random(f"simplan-random:{self.seed}:{task.env}:{task.task_id}")

    def choose(self, candidates: list[str] | None) -> str:
        listed = candidates or self.obs.valid_actions
        if listed:
            return self.rng.choice(sorted(listed))
        if self.obs.tools:
            return render_action(self._random_call(self.obs.tools))
        return "look"

    def _random_call(self, tools: list[dict[str, Any]]) -> Action:
        tool = self.rng.choice(tool_specs(tools))  # OpenAI-style {"type": "function", ...} unwrapped, or bare
        if tool.get("name") == "finish":
            return Action(kind="finish")
        params = tool.get("parameters") or {}
        props: dict[str, Any] = params.get("properties") or {}
        words = re.findall(r"[A-Za-z][\w-]*", f"{self.obs.goal} {self.obs.text}") or ["x"]
        required = params.get("required", list(props))
        args = {name: self._value(spec, words) for name, spec in props.items() if name in required}
        return Action.tool_call(str(tool.get("name") or "finish"), args)

    def _value(self, spec: dict[str, Any], words: list[str]) -> Any:
        kind = spec.get("type") if isinstance(spec, dict) else None
        if spec.get("enum"):
            return self.rng.choice(spec["enum"])
        if kind == "integer":
            return self.rng.randint(1, 3)
        if kind == "number":
            return float(self.rng.randint(1, 3))
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "array":
            return [self.rng.choice(words)]
        if kind == "object":
            return {}
        return self.rng.choice(words)


class ModelFreeEngine:
    """`--engine expert | random`: binds a fresh decider to each planner's env (`Planner` calls `bind`)."""

    adapters = ["decider"]
    tokenizer = None

    def __init__(self, kind: str, seed: int = 0) -> None:
        if kind not in DECIDERS:
            raise ValueError(f"engine: {kind!r} is not a model-free engine ({', '.join(DECIDERS)})")
        self.kind, self.seed = kind, seed
        self.usage = EngineUsage()  # summed over every bound decider

    def bind(self, env: Env) -> tuple[ModelFreeDecider, WatchedEnv]:
        """A decider for `env` and the env that reports to it: the planner uses both instead of (self, env)."""
        decider = DECIDERS[self.kind](self.usage, self.seed)
        return decider, WatchedEnv(env, decider)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        raise RuntimeError(f"the {self.kind} engine answers from an episode: Planner binds it to its env first")

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        raise RuntimeError(f"the {self.kind} engine answers from an episode: Planner binds it to its env first")

    def close(self) -> None:
        pass


DECIDERS: dict[str, type[ModelFreeDecider]] = {"expert": ExpertDecider, "random": RandomDecider}

"""Fault injection: an `Env` wrapper that makes real steps fail, to measure how agents recover.

    from simplan.evaluation.faults import FaultConfig, FaultyEnv
    env = FaultyEnv(make_env("twx"), FaultConfig(transient=0.1, perturb=0.05, seed=0))
    env.begin_episode("twx-dev/twx/coin-dev-0/0")      # optional: the fault schedule's identity
    obs = env.reset(task)
    result = env.step(action)                            # result.info["fault"] is set when one fired

Suites set faults per suite (recipes/suites/*.yaml, key `faults`); `simplan eval --faults
'{transient: 0.1}'` overrides them. Kinds (at most one per step):

- ``transient``: the action is NOT executed; an error observation says it failed this time and
  may be retried. The state, score and valid actions are those of the last real observation.
- ``tool_error`` (tool environments, `tool_call` actions only): the call is NOT executed; the
  result is a JSON error object like a failing backend returns.
- ``perturb``: the action IS executed, but the observation text is altered (a sentence dropped,
  two sentences swapped, or a distracting sentence added). Flags, score and valid actions are real.

Faults speak the env's language: in a tool environment (one with tools, or whose observations are JSON)
a transient failure is a JSON error object too, and a JSON observation is perturbed as JSON (a key
dropped or a distracting "notice" added), never turned into prose. Both failures read as transient
(`FaultyEnv.transient_patterns`: the env's own plus these texts), so the planner retries them.

Each step draws one uniform number u from a generator seeded by (seed, episode key, step index), so
a fault schedule is deterministic and independent of the agent: the same task gets the same faults
at the same step under every arm (the evaluation keys episodes without the arm for this reason).
u falls in [0, transient) -> transient, then [.., + tool_error) -> tool_error (only for tool calls),
then [.., + perturb) -> perturb, so each kind fires at exactly its configured rate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from simplan.core.config import coerce
from simplan.envs.base import Action, Env, Observation, StepResult, Task, env_extra

FAULT_KINDS: tuple[str, ...] = ("transient", "tool_error", "perturb")
TRANSIENT_TEXT = "Nothing happens: the action failed this time (a transient error). It may work if you try again."
TOOL_ERROR_TEXT = "{name}: the service is temporarily unavailable (error 503); the call was not executed, retry it"
TRANSIENT_TOOL_TEXT = "the call failed this time (a transient error) and did not run; it may work if you try again"
# The failures above are transient by construction: they are retried like the env's own (envs/base.py).
FAULT_TRANSIENT_PATTERNS: tuple[str, ...] = (r"\(a transient error\)", r"temporarily unavailable \(error 503\)")
DISTRACTORS = (
    "You hear a faint noise somewhere far away.",
    "A draft of cold air passes by.",
    "For a moment the light flickers.",
    "Somewhere, a clock ticks.",
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass
class FaultConfig:
    """Per-step fault probabilities (their sum must be <= 1) and the schedule's seed."""

    transient: float = field(default=0.0, metadata={"help": "rate of transient action failures (not executed)"})
    tool_error: float = field(default=0.0, metadata={"help": "rate of tool errors on tool calls (not executed)"})
    perturb: float = field(default=0.0, metadata={"help": "rate of perturbed observations (executed, text altered)"})
    seed: int = field(default=0, metadata={"help": "seed of the fault schedule"})
    max_per_episode: int = field(default=0, metadata={"help": "faults per episode at most (0: no limit)"})
    start_step: int = field(default=0, metadata={"help": "no fault before this step index (0-based)"})

    def __post_init__(self) -> None:
        for name in FAULT_KINDS:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FaultConfig.{name}: must be in [0, 1], got {value!r}")
        total = self.transient + self.tool_error + self.perturb
        if total > 1.0 + 1e-9:
            raise ValueError(f"FaultConfig: transient + tool_error + perturb must be <= 1, got {total:g}")
        if self.max_per_episode < 0:
            raise ValueError(f"FaultConfig.max_per_episode: must be >= 0, got {self.max_per_episode}")
        if self.start_step < 0:
            raise ValueError(f"FaultConfig.start_step: must be >= 0, got {self.start_step}")

    @property
    def active(self) -> bool:
        return self.transient + self.tool_error + self.perturb > 0

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> FaultConfig:
        d = dict(d or {})
        unknown = sorted(set(d) - set(FaultConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"faults: unknown key(s) {unknown}; valid: {sorted(FaultConfig.__dataclass_fields__)}")
        hints = typing.get_type_hints(FaultConfig)  # read by type, as a recipe's values are ('1e-1' is a number)
        return FaultConfig(**{k: coerce(v, hints[k], f"faults.{k}") for k, v in d.items()})

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FaultConfig.__dataclass_fields__}


def step_rng(seed: int, episode: str, step: int) -> random.Random:
    """The generator of one (seed, episode, step): stable across processes (no Python hash salt)."""
    digest = hashlib.sha256(f"{seed}\x1f{episode}\x1f{step}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def choose_fault(cfg: FaultConfig, rng: random.Random, action: Action) -> str | None:
    """The fault of one step (or None), from one uniform draw partitioned by the configured rates."""
    u = rng.random()
    if u < cfg.transient:
        return "transient"
    u -= cfg.transient
    if u < cfg.tool_error:
        return "tool_error" if action.kind == "tool_call" else None
    u -= cfg.tool_error
    if u < cfg.perturb:
        return "perturb"
    return None


def json_object(text: str) -> dict[str, Any] | None:
    """The JSON object `text` holds, None when it is not one."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def perturb_json(obj: dict[str, Any], rng: random.Random) -> str:
    """Alter a JSON object observation and keep it JSON: drop a key when there are several, else add a
    distracting "notice"."""
    out = dict(obj)
    if len(out) >= 2 and rng.random() < 0.5:
        del out[rng.choice(sorted(out))]
    else:
        out["notice"] = rng.choice(DISTRACTORS)
    return json.dumps(out)


def perturb_text(text: str, rng: random.Random) -> str:
    """Alter an observation: drop or swap a sentence when there are several, else add a distractor."""
    sentences = [s for s in _SENTENCE.split(text.strip()) if s]
    mode = rng.choice(("drop", "swap", "add")) if len(sentences) >= 2 else "add"
    if mode == "drop":
        del sentences[rng.randrange(len(sentences))]
    elif mode == "swap":
        i = rng.randrange(len(sentences) - 1)
        sentences[i], sentences[i + 1] = sentences[i + 1], sentences[i]
    else:
        sentences.insert(rng.randrange(len(sentences) + 1), rng.choice(DISTRACTORS))
    out = " ".join(sentences)
    return out if out != text.strip() else f"{out} {DISTRACTORS[0]}"


class FaultyEnv:
    """Implements `envs.base.Env` by delegating to `env`, injecting faults into `step` (module docstring)."""

    def __init__(self, env: Env, faults: FaultConfig) -> None:
        self.env = env
        self.faults = faults
        self._episode = ""
        self._explicit_episode: str | None = None
        self._steps = 0
        self._fired = 0
        self._last: StepResult | None = None
        self.counts: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)  # over the wrapper's life
        self.steps_seen = 0

    @property
    def name(self) -> str:
        return self.env.name

    def __getattr__(self, attr: str) -> Any:  # env-specific extras (error_patterns, families, ...)
        if attr == "env":
            raise AttributeError(attr)
        return getattr(self.env, attr)

    @property
    def transient_patterns(self) -> tuple[str, ...]:
        """The env's transient failures and the ones this wrapper injects (module docstring)."""
        return tuple(env_extra(self.env, "transient_patterns")) + FAULT_TRANSIENT_PATTERNS

    def begin_episode(self, key: str) -> None:
        """Name the next episode's fault schedule (default: "{env}/{task_id}" at reset)."""
        self._explicit_episode = key

    # -- Env protocol --------------------------------------------------------------------------
    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        return self.env.tasks(fold, families=families, limit=limit)

    def reset(self, task: Task) -> Observation:
        obs = self.env.reset(task)
        self._episode = self._explicit_episode or f"{task.env}/{task.task_id}"
        self._explicit_episode = None
        self._steps = 0
        self._fired = 0
        self._last = StepResult(observation=obs)
        return obs

    def step(self, action: Action) -> StepResult:
        index = self._steps
        self._steps += 1
        self.steps_seen += 1
        cfg = self.faults
        kind = None
        rng = step_rng(cfg.seed, self._episode, index)
        room = not cfg.max_per_episode or self._fired < cfg.max_per_episode
        if cfg.active and room and index >= cfg.start_step:
            kind = choose_fault(cfg, rng, action)
        if kind in ("transient", "tool_error"):
            result = self._not_executed(kind, action)
        else:
            result = self.env.step(action)
            self._last = result
            if kind == "perturb":
                obs = result.observation
                as_json = json_object(obs.text)
                text = perturb_json(as_json, rng) if as_json is not None else perturb_text(obs.text, rng)
                altered = dataclasses.replace(obs, text=text)
                result = StepResult(altered, result.reward, result.score, result.done, result.won, dict(result.info))
        if kind is not None:
            self._fired += 1
            self.counts[kind] += 1
            result.info["fault"] = kind
        return result

    def _not_executed(self, kind: str, action: Action) -> StepResult:
        last = self._last or StepResult(observation=Observation(text=""))
        prev = last.observation
        if kind == "tool_error":
            text = json.dumps({"error": TOOL_ERROR_TEXT.format(name=action.name)})
        elif prev.tools or json_object(prev.text) is not None:  # a tool env: errors are JSON objects
            text = json.dumps({"error": TRANSIENT_TOOL_TEXT})
        else:
            text = TRANSIENT_TEXT
        obs = dataclasses.replace(prev, text=text, error=True)
        return StepResult(obs, reward=0.0, score=last.score, done=False, won=False, info={"injected": True})

    def expert_plan(self) -> list[Action]:
        return self.env.expert_plan()

    def parse_action(self, text: str) -> Action:
        return self.env.parse_action(text)

    def close(self) -> None:
        self.env.close()


def wrap_faults(env: Env, faults: FaultConfig | None) -> Env:
    """`env` wrapped when any fault rate is set, else `env` itself."""
    return FaultyEnv(env, faults) if faults is not None and faults.active else env

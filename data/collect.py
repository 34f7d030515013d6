"""Collect trajectories from any registered environment: expert, noisy expert, random and branches.

    simplan collect --env twx --fold train --policies expert,noisy_expert,random --limit 20 \\
        --out runs/data/twx-train.jsonl --workers 2
    simplan collect --config recipes/collect/twx-train.yaml

    from simplan.data.collect import CollectConfig, collect
    report = collect(CollectConfig(env="toy", limit=10, out="runs/data/toy.jsonl"))

Policies (one episode id per task, policy and attempt: "{env}/{task_id}/{policy}/{attempt}"):

The expert is the env's reacting policy (`expert_action(observation)`, envs/base.py EnvDefaults) where
the adapter offers one, else its fixed `expert_plan()` (`Expert`). A policy is asked for each step at the
real state, so it recovers from what happened (a 503, a sold-out item, a noisy step); where a fixed path
is needed (argument values for random tool calls, where noise and branch points fall) it is the policy's
run from reset.

- ``expert``: the expert played from reset.
- ``noisy_expert``: the expert with real mistakes. Before an expert step, with probability
  `noise_rate` (and at least `min_mistakes` times per episode), the collector plays a mistake
  instead: an *invalid* action (a plausible command outside the valid actions, an unknown tool or a
  call missing its arguments) or a *wrong valid* action (another valid action, or a read-only tool
  call). What happens next depends on what the mistake did to the state:

  * it left the state unchanged (an error observation, a command outside the valid set, or a
    look/inventory/examine-style command or read-only tool call, checked by comparing the valid
    actions and score before and after): the expert plan simply continues;
  * it changed the state and the expert is a policy: the policy goes on from the real state (its next
    step is the recovery);
  * it changed the state and a reversible inverse is known (go east/go west, open/close,
    take/drop or put, turn on/off): the inverse is played, and kept only if the valid actions and
    score are back to what they were before the mistake;
  * otherwise (no inverse, a failed inverse, or the mistake ended the episode) the off-path steps
    are split off into a separate *branch* record (policy ``random``, `meta.kind = "branch"`),
    used as simulator data only, and the main episode is restored by resetting the env and
    replaying its own recorded actions; the main record is always one continuous real run.

  The expert step that resumes the plan right after a mistake, and any inverse, carry
  `Step.source = "recovery"`; mistakes carry ``"noise"``; plain plan steps ``"expert"``.
- ``random``: uniformly random valid actions (random tool calls built from the tool schemas with
  argument values borrowed from the expert plan, for tool envs), `random_steps` steps at most.
- branches (`branches > 0`): off-path coverage for the simulator. From a random point of the
  expert path, one random non-expert action is played and recorded after the replayed expert
  prefix (policy ``random``, attempt ``branch{k}``, `meta.branch_step` = index of the new step;
  steps before it repeat the expert path so the record keeps its real history).
- losing branches (`losing_branches > 0`): what irreversible mistakes lead to. From points of the
  expert path, listed actions other than the expert's (look-only ones left out) are tried, each
  after a reset and the replayed expert prefix, until one ends the episode unwon (TWX sorting's
  wrong item in the box, a wrong answer in arithmetic): that step, with the losing observation, is
  recorded after the prefix (policy ``random``, attempt ``lose{k}``, source ``noise``,
  `meta.losing = true`). At most `losing_tries` actions are tried; when none loses, the last one is
  kept as an ordinary branch (`meta.losing = false`), so every planned record exists and a resumed
  run does not search again. Envs that list no actions (tool envs) get an ordinary branch.

Steps keep the env's `info`; when an observation brings a new goal (a BFCL user turn, a TWX
recipe or map the agent has read),
`info["goal"]` holds it, and when it changes the tool list (BFCL miss_func adds functions mid
episode), `info["tools"]` holds the new list; dataset prompts follow both from step to step.
Episodes run grouped by family (a TWX game switch reloads the game).

Output is one append-only JSONL file of trajectory records (`simplan validate` checks it). Each
finished episode is appended in one write with its split-off branches, so re-running the same
command skips episode ids already in the file and resumes where a crash stopped; a torn last line
is reported, moved to `{out}.torn`, and collected again. An env that raises (a crashed JVM,
`EnvCrashed`, any exception) marks its episode `status: "errored"` with the message; the worker
then recreates its env. Episodes longer than `max_steps` end with `status: "truncated"`. Noise is
seeded from (`seed`, episode id), so the same command collects the same data.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from simplan.data.io import append_jsonl, read_jsonl_tolerant, write_jsonl
from simplan.data.trajectory import Step, Trajectory
from simplan.envs import registry
from simplan.envs.base import FOLDS, Action, Env, Observation, StepResult, Task, expert_policy
from simplan.envs.registry import make_env
from simplan.scripts.config import comma_list

POLICIES: tuple[str, ...] = ("expert", "noisy_expert", "random")


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class CollectConfig:
    """What to collect, how, and where to write it (`simplan collect --help` lists every field)."""

    env: str = field(default="toy", metadata={"help": "registered environment name (simplan envs list)"})
    fold: str = field(default="train", metadata={"help": "task fold: train, dev or test"})
    families: list[str] | None = field(
        default=None, metadata={"help": "only these families (TWX games, ScienceWorld task types, BFCL categories)"}
    )
    limit: int | None = field(default=None, metadata={"help": "tasks per family (first N in the env's order)"})
    family_limits: dict[str, int] = field(
        default_factory=dict,
        metadata={
            "help": "tasks per family for the named families, overriding `limit` (YAML mapping, e.g. {twc: 96})"
        },
    )
    max_tasks: int | None = field(
        default=None, metadata={"help": "tasks in total after `limit`, taken round-robin across families"}
    )
    policies: list[str] = field(
        default_factory=lambda: ["expert", "noisy_expert"],
        metadata={"help": f"policies to run, any of {', '.join(POLICIES)}"},
    )
    attempts: int = field(
        default=1, metadata={"help": "episodes per task for noisy_expert and random (expert runs once per task)"}
    )
    branches: int = field(
        default=0, metadata={"help": "off-path branch transitions per task (simulator coverage), 0 for none"}
    )
    losing_branches: int = field(
        default=0,
        metadata={"help": "branches per task into an action that loses the episode (done, not won), 0 for none"},
    )
    losing_tries: int = field(
        default=30, metadata={"help": "losing branches: actions tried (each from a reset) before giving up"}
    )
    noise_rate: float = field(default=0.2, metadata={"help": "noisy_expert: chance of a mistake before a plan step"})
    invalid_share: float = field(
        default=0.5, metadata={"help": "noisy_expert: share of mistakes that are invalid actions (rest: wrong valid)"}
    )
    min_mistakes: int = field(default=1, metadata={"help": "noisy_expert: mistakes kept per episode at least"})
    max_steps: int = field(default=100, metadata={"help": "step cap of an episode; hitting it -> status truncated"})
    random_steps: int = field(default=20, metadata={"help": "length of a random-policy episode"})
    workers: int = field(default=1, metadata={"help": "worker processes, each with its own env (JVM)"})
    out: str = field(default="runs/data/trajectories.jsonl", metadata={"help": "append-only JSONL output"})
    seed: int = field(default=0, metadata={"help": "base seed; noise is seeded from (seed, episode id)"})
    env_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "keyword arguments for the env's constructor (YAML mapping)"}
    )
    retry_errored: bool = field(
        default=False, metadata={"help": "drop errored episodes already in `out` and collect them again"}
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        self.policies = comma_list(self.policies)
        if self.families is not None:
            self.families = comma_list(self.families)
        if not self.env:
            raise ValueError("env: give a registered environment name (see `simplan envs list`)")
        if self.fold not in FOLDS:
            raise ValueError(f"fold: {self.fold!r} is not one of {FOLDS}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad or not self.policies:
            raise ValueError(f"policies: {bad or self.policies!r}; choose from {', '.join(POLICIES)}")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: {self.policies!r} lists a policy twice")
        for name in ("limit", "max_tasks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: {value} must be at least 1 (or null for all)")
        for name in ("attempts", "max_steps", "random_steps", "workers", "losing_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} must be at least 1")
        for name in ("branches", "losing_branches", "min_mistakes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be 0 or more")
        for name in ("noise_rate", "invalid_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: {getattr(self, name)} must be between 0 and 1")
        if not isinstance(self.family_limits, dict):
            raise ValueError(f"family_limits: expected a mapping of family to task count, got {self.family_limits!r}")
        bad_limits = {f: n for f, n in self.family_limits.items() if not isinstance(n, int) or n < 1}
        if bad_limits:
            raise ValueError(f"family_limits: {bad_limits} must be whole numbers of at least 1")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs: expected a mapping, got {self.env_kwargs!r}")
        if not self.out:
            raise ValueError("out: give the output JSONL path")


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to collect. `attempt` is a number, `branch{k}` for a branch transition or `lose{k}` for a
    losing branch."""

    task: Task
    policy: str
    attempt: str

    @property
    def id(self) -> str:
        return episode_id(self.task.env, self.task.task_id, self.policy, self.attempt)


def episode_id(env: str, task_id: str, policy: str, attempt: int | str) -> str:
    return f"{env}/{task_id}/{policy}/{attempt}"


@dataclass
class EpisodeOutcome:
    """What one worker call returns: the records to append (main first) and counters."""

    id: str
    records: list[dict[str, Any]]
    status: str
    transitions: int  # new real transitions recorded (branch prefixes not counted twice)
    env_steps: int  # every env.step call, including replays
    crashed: bool = False


# ---------------------------------------------------------------------------------------------
# Task and episode planning
# ---------------------------------------------------------------------------------------------
def select_tasks(env: Env, cfg: CollectConfig) -> list[Task]:
    """The fold's tasks, `limit` per family (`family_limits` for those it names), then `max_tasks` in total
    taken round-robin by family."""
    tasks = env.tasks(cfg.fold, families=cfg.families, limit=None)
    by_family: dict[str, list[Task]] = {}
    for task in tasks:
        by_family.setdefault(task.family, []).append(task)
    if cfg.families:
        missing = [f for f in cfg.families if f not in by_family]
        if missing:
            known = sorted({t.family for t in env.tasks(cfg.fold)})
            raise ValueError(f"families: {missing} have no {cfg.fold} tasks in {cfg.env}; known: {known}")
    unknown = sorted(set(cfg.family_limits) - set(by_family))
    if unknown:
        raise ValueError(f"family_limits: {unknown} have no {cfg.fold} tasks here; families: {sorted(by_family)}")
    groups = [group[: cfg.family_limits.get(family, cfg.limit) or None] for family, group in by_family.items()]
    picked: list[Task] = []
    for i in range(max((len(g) for g in groups), default=0)):
        picked += [g[i] for g in groups if i < len(g)]
    if cfg.max_tasks is not None:
        picked = picked[: cfg.max_tasks]
    order = {id(t): n for n, t in enumerate(tasks)}
    return sorted(picked, key=lambda t: order[id(t)])


def plan_episodes(tasks: list[Task], cfg: CollectConfig) -> list[EpisodeSpec]:
    """Episodes grouped by family: envs like TWX reload their game (~0.2 s) when the family changes."""
    first_seen = {f: n for n, f in reversed(list(enumerate(t.family for t in tasks)))}
    specs = []
    for task in sorted(tasks, key=lambda t: first_seen[t.family]):
        for policy in cfg.policies:
            n = 1 if policy == "expert" else cfg.attempts
            specs += [EpisodeSpec(task, policy, str(a)) for a in range(n)]
        specs += [EpisodeSpec(task, "random", f"branch{k}") for k in range(cfg.branches)]
        specs += [EpisodeSpec(task, "random", f"lose{k}") for k in range(cfg.losing_branches)]
    return specs


# ---------------------------------------------------------------------------------------------
# Mistakes and recoveries
# ---------------------------------------------------------------------------------------------
_OPPOSITE = {"north": "south", "east": "west", "up": "down", "northeast": "southwest", "northwest": "southeast"}
_OPPOSITE |= {v: k for k, v in _OPPOSITE.items()}
_TOGGLES = (("open", "close"), ("turn on", "turn off"), ("activate", "deactivate"), ("lock", "unlock"))
# Commands that only look: they cannot change the world (verified against the valid actions too).
_LOOK_ONLY = re.compile(r"^(look|look around|look at .+|l|inventory|inv|i|examine .+|x .+|score|task|help)$")
# Tool calls that only read state (BFCL-style names); an erroring call changes nothing either.
_READ_ONLY_TOOL = re.compile(
    r"^(ls|pwd|cat|grep|tail|head|wc|du|diff|find|stat|mean|get|list|check|display|view|show|search|describe|query)"
    r"(_|$)"
)
_ABSENT_NOUNS = ("unicorn", "golden key", "spaceship", "piano", "dragon", "teapot", "lantern", "treasure chest")
_DIRECTIONS = ("north", "south", "east", "west")


def _norm(cmd: str) -> str:
    return " ".join(cmd.strip().lower().split())


def is_look_only(action: Action) -> bool:
    """True for commands/tool calls that observe without acting (look, inventory, ls, get_...)."""
    if action.kind == "command":
        return bool(_LOOK_ONLY.match(_norm(action.text)))
    if action.kind == "tool_call":
        return bool(_READ_ONLY_TOOL.match(action.name.lower()))
    return False


def inverse_candidates(action: Action) -> list[str]:
    """Commands that would undo `action` (most specific first); empty when no inverse is known."""
    if action.kind != "command":
        return []
    cmd = _norm(action.text)
    m = re.fullmatch(r"(go|move|walk|run)\s+(?:to\s+(?:the\s+)?)?(\w+)", cmd)
    if m and m.group(2) in _OPPOSITE:
        return [f"{m.group(1)} {_OPPOSITE[m.group(2)]}"]
    if cmd in _OPPOSITE:
        return [_OPPOSITE[cmd]]
    for a, b in _TOGGLES:
        for x, y in ((a, b), (b, a)):
            if cmd.startswith(x + " "):
                return [f"{y} {cmd[len(x) + 1 :]}"]
    m = re.fullmatch(r"(?:take|get|pick up)\s+(.+?)\s+from\s+(.+)", cmd)
    if m:
        obj, src = m.groups()
        return [f"put {obj} in {src}", f"put {obj} on {src}", f"put {obj} into {src}", f"move {obj} to {src}"]
    m = re.fullmatch(r"(?:take|get|pick up)\s+(.+)", cmd)
    if m:
        return [f"drop {m.group(1)}", f"put down {m.group(1)}"]
    m = re.fullmatch(r"(?:drop|put down)\s+(.+)", cmd)
    if m:
        return [f"take {m.group(1)}", f"pick up {m.group(1)}"]
    m = re.fullmatch(r"(?:put|place|move)\s+(.+?)\s+(?:in|on|into|onto|to)\s+(.+)", cmd)
    if m:
        obj, dst = m.groups()
        return [f"take {obj} from {dst}", f"take {obj}"]
    return []


def _verb_object(cmd: str) -> tuple[str, str]:
    words = cmd.split()
    if len(words) >= 3 and words[1] in ("on", "off", "up", "down", "at"):
        return " ".join(words[:2]), " ".join(words[2:])
    return words[0], " ".join(words[1:]).split(" from ")[0].split(" in ")[0].split(" on ")[0]


def invalid_command(valid: list[str] | None, rng: random.Random) -> str:
    """A plausible command that is not valid here: a blocked direction, a wrong verb-object pair, a missing thing."""
    valid_set = {_norm(v) for v in valid or []}
    verbs, objects = ["take", "open", "examine", "eat"], list(_ABSENT_NOUNS)
    move = "go"
    for v in valid_set:
        verb, obj = _verb_object(v)
        if obj:  # verbs that take an object, recombined with other objects: "eat door", "open key"
            verbs.append(verb)
            objects.append(obj)
        if verb in ("go", "move", "walk") and obj in _OPPOSITE:
            move = verb
    candidates = [f"{move} {d}" for d in _DIRECTIONS]
    candidates += [f"{rng.choice(verbs)} {rng.choice(objects)}" for _ in range(8)]
    candidates += [f"{rng.choice(verbs)} {noun}" for noun in _ABSENT_NOUNS]
    candidates = [c for c in dict.fromkeys(candidates) if _norm(c) not in valid_set]
    return rng.choice(candidates)


def _tool_specs(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [t.get("function", t) for t in tools or [] if isinstance(t.get("function", t), dict)]


def _argument_pool(plan: list[Action]) -> dict[str, list[Any]]:
    pool: dict[str, list[Any]] = {}
    for a in plan:
        for k, v in a.arguments.items():
            pool.setdefault(k, []).append(v)
    return pool


_DEFAULT_BY_TYPE: dict[str, Any] = {"string": "", "integer": 0, "number": 0.0, "float": 0.0, "boolean": False}


def random_tool_call(
    tools: list[dict[str, Any]], pool: dict[str, list[Any]], rng: random.Random, read_only: bool = False
) -> Action | None:
    """A call to one of the task's tools with its required arguments, values borrowed from `pool`."""
    specs = [t for t in _tool_specs(tools) if t.get("name")]
    if read_only:
        specs = [t for t in specs if _READ_ONLY_TOOL.match(str(t["name"]).lower())]
    if not specs:
        return None
    spec = rng.choice(specs)
    params = spec.get("parameters") or {}
    props = params.get("properties") or {}
    args: dict[str, Any] = {}
    for name in params.get("required") or []:
        if pool.get(name):
            args[name] = rng.choice(pool[name])
        else:
            kind = (props.get(name) or {}).get("type", "string")
            args[name] = (
                [] if kind == "array" else {} if kind in ("dict", "object") else _DEFAULT_BY_TYPE.get(kind, "")
            )
    return Action.tool_call(str(spec["name"]), args)


def invalid_tool_call(tools: list[dict[str, Any]], rng: random.Random) -> Action:
    """An unknown tool, or a real tool called without its required arguments."""
    specs = [t for t in _tool_specs(tools) if t.get("name")]
    needs_args = [t for t in specs if (t.get("parameters") or {}).get("required")]
    if needs_args and rng.random() < 0.5:
        return Action.tool_call(str(rng.choice(needs_args)["name"]), {})
    names = {str(t["name"]) for t in specs}
    base = rng.choice(sorted(names)) if names else "tool"
    name = next(n for n in (f"{base}_all", f"{base}_v2", f"{base}_now", "do_task") if n not in names)
    return Action.tool_call(name, {})


# ---------------------------------------------------------------------------------------------
# Recording episodes
# ---------------------------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=str))


def _valid_set(obs: Observation) -> frozenset[str] | None:
    return None if obs.valid_actions is None else frozenset(_norm(v) for v in obs.valid_actions)


class Recorder:
    """Plays actions in an env and records them as Steps of one Trajectory (a continuous real run)."""

    def __init__(self, env: Env, spec: EpisodeSpec, meta: dict[str, Any]) -> None:
        self.env, self.spec = env, spec
        self.env_steps = 0
        self.obs = env.reset(spec.task)
        self.last: StepResult | None = None
        self.traj = Trajectory(
            id=spec.id,
            env=spec.task.env,
            task=spec.task,
            goal=self.obs.goal,
            policy=spec.policy,
            initial_observation=self.obs.text,
            tools=_jsonable(self.obs.tools),
            meta=dict(meta),
        )

    @property
    def steps(self) -> list[Step]:
        return self.traj.steps

    @property
    def score(self) -> float:
        return self.last.score if self.last is not None else 0.0

    @property
    def done(self) -> bool:
        return self.last is not None and self.last.done

    def act(self, action: Action, source: str) -> StepResult:
        before = self.obs
        result = self.env.step(action)
        self.env_steps += 1
        obs = result.observation
        info = _jsonable(dict(result.info or {}))
        if obs.goal and obs.goal != self.traj.goal:  # a BFCL user turn, or what a TWX agent read
            info["goal"] = obs.goal
        if obs.tools is not None and before.tools is not None and obs.tools != before.tools:
            info["tools"] = _jsonable(obs.tools)
        self.steps.append(
            Step(
                index=len(self.steps),
                observation=before.text,
                action=action,
                next_observation=obs.text,
                reward=float(result.reward),
                score=float(result.score),
                done=bool(result.done),
                won=bool(result.won),
                error=bool(obs.error),
                valid_actions=list(before.valid_actions) if before.valid_actions is not None else None,
                source=source,
                info=info,
            )
        )
        self.obs, self.last = obs, result
        return result

    def note(self, action: Action, text: str, source: str) -> None:
        """Record an action that never reached the env (an injected transient fault, inference/faults.py): it
        failed with `text` and the state is unchanged."""
        before = self.obs
        self.steps.append(
            Step(
                index=len(self.steps),
                observation=before.text,
                action=action,
                next_observation=text,
                score=float(self.score),
                error=True,
                valid_actions=list(before.valid_actions) if before.valid_actions is not None else None,
                source=source,
            )
        )
        self.obs = replace(before, text=text, error=True)

    def restore(self, keep: int) -> bool:
        """Reset and replay the first `keep` recorded actions; the replayed steps replace the record.

        Returns whether the replay reproduced the recorded observations (a deterministic env).
        """
        old = self.steps[:keep]
        self.obs = self.env.reset(self.spec.task)
        matched = self.obs.text == self.traj.initial_observation
        self.traj.initial_observation = self.obs.text
        self.traj.steps = []
        self.last = None
        for step in old:
            self.act(step.action, step.source)
            matched = matched and self.steps[-1].next_observation == step.next_observation
        return matched

    def finish(self, truncated: bool = False) -> Trajectory:
        self.traj.success = bool(self.last is not None and self.last.won)
        self.traj.final_score = float(self.score)
        self.traj.status = "truncated" if truncated and not self.done else "ok"
        return self.traj


def _branch_record(rec: Recorder, steps: list[Step], branch_step: int, tag: str) -> Trajectory:
    """A split-off record of off-path steps (simulator data only)."""
    last = steps[-1]
    return Trajectory(
        id=episode_id(rec.spec.task.env, rec.spec.task.task_id, "random", tag),
        env=rec.traj.env,
        task=rec.traj.task,
        goal=rec.traj.goal,
        policy="random",
        initial_observation=rec.traj.initial_observation,
        steps=[Step.from_dict(s.to_dict()) for s in steps],
        tools=rec.traj.tools,
        success=last.won,
        final_score=last.score,
        status="ok",
        meta={**rec.traj.meta, "kind": "branch", "parent": rec.traj.id, "branch_step": branch_step},
    )


@dataclass
class Expert:
    """The expert of one episode: the env's reacting policy where it offers one, else its fixed plan.

    `path` is the fixed plan, or the policy's actions on a clean run from reset (argument values for random
    tool calls, and where noise and branch points fall); empty when nothing needs it."""

    path: list[Action]
    policy: Callable[[Observation], Action | None] | None = None

    @property
    def kind(self) -> str:
        return "plan" if self.policy is None else "policy"

    def next(self, rec: Recorder, played: int) -> Action | None:
        """The expert's action at the recorder's real state, after `played` expert steps; None: it is done."""
        if self.policy is not None:
            return self.policy(rec.obs)
        return self.path[played] if played < len(self.path) else None

    def ahead(self, played: int, action: Action) -> list[Action]:
        """Expert steps a mistake must not be (a later step done early can be a shortcut, not a mistake)."""
        return self.path[played:] if self.policy is None else [action, *self.path]


def make_expert(env: Env, rec: Recorder, cfg: CollectConfig, needs_path: bool) -> Expert:
    """The episode's `Expert`; a policy's path (when `needs_path`) is its run from reset, then the env is reset."""
    policy = expert_policy(env)
    if policy is None:
        return Expert(list(env.expert_plan()))
    if not needs_path:
        return Expert([], policy)
    path: list[Action] = []
    while len(path) < cfg.max_steps and not rec.done and (action := policy(rec.obs)) is not None:
        rec.act(action, "expert")
        path.append(action)
    rec.restore(0)
    return Expert(path, policy)


def run_expert(rec: Recorder, expert: Expert, cfg: CollectConfig) -> list[Trajectory]:
    played = 0
    while not rec.done and (action := expert.next(rec, played)) is not None:
        if len(rec.steps) >= cfg.max_steps:
            return [rec.finish(truncated=True)]
        rec.act(action, "expert")
        played += 1
    return [rec.finish()]


def _choose_mistake(
    rec: Recorder, remaining: list[Action], plan: list[Action], cfg: CollectConfig, rng: random.Random
):
    """(action, kind) for a mistake at the current state, kind 'invalid' or 'wrong'.

    A wrong action is none of the plan's remaining steps: doing a later step early can be a shortcut
    (TWX coin: "take coin" before "look around" wins), not a mistake.
    """
    obs = rec.obs
    want_invalid = rng.random() < cfg.invalid_share
    if obs.valid_actions is not None:
        ahead = {_norm(a.text) for a in remaining if a.kind == "command"}
        others = [v for v in obs.valid_actions if _norm(v) not in ahead]
        if others and not want_invalid:
            return Action.command(rng.choice(others)), "wrong"
        return Action.command(invalid_command(obs.valid_actions, rng)), "invalid"
    if obs.tools:
        if not want_invalid:
            call = random_tool_call(obs.tools, _argument_pool(plan), rng, read_only=rng.random() < 0.5)
            if call is not None and call not in remaining:
                return call, "wrong"
        return invalid_tool_call(obs.tools, rng), "invalid"
    return Action.command(invalid_command(None, rng)), "invalid"


def run_noisy(rec: Recorder, expert: Expert, cfg: CollectConfig, rng: random.Random) -> list[Trajectory]:
    plan = expert.path
    branches: list[Trajectory] = []
    counts = Counter()
    forced_at = rng.randrange(len(plan)) if plan else 0
    # At most one mistake before each expert step: the loop always advances, and a mistake is
    # always followed by a real expert step (never by another mistake).
    i, tried_at, resume_source, finished = 0, -1, "expert", False
    while not rec.done:
        if len(rec.steps) >= cfg.max_steps:
            break
        action = expert.next(rec, i)
        if action is None:
            finished = True
            break
        force = counts["kept"] < cfg.min_mistakes and i >= forced_at
        room = len(rec.steps) + 2 < cfg.max_steps
        if tried_at != i and room and (force or rng.random() < cfg.noise_rate):
            tried_at = i
            outcome = _play_mistake(rec, expert.ahead(i, action), expert, cfg, rng, branches, counts)
            counts[outcome] += 1
            counts["kept"] += outcome != "split"
            # After a kept mistake the resumed expert step is the recovery (a policy's answer to the changed
            # state included); after an inverse the inverse was; after a split the main run never saw it.
            resume_source = "recovery" if outcome in ("kept_unchanged", "kept_changed") else "expert"
            continue
        rec.act(action, resume_source)
        resume_source = "expert"
        i += 1
    traj = rec.finish(truncated=not finished and not rec.done)
    traj.meta["mistakes"] = dict(counts)
    return [traj, *branches]


def _play_mistake(
    rec: Recorder,
    remaining: list[Action],
    expert: Expert,
    cfg: CollectConfig,
    rng: random.Random,
    branches: list[Trajectory],
    counts: Counter,
) -> str:
    """Play one mistake and recover; returns how it ended (kept_unchanged, kept_changed, kept_inverse, split)."""
    start = len(rec.steps)
    valid_before, score_before = _valid_set(rec.obs), rec.score
    mistake, kind = _choose_mistake(rec, remaining, expert.path, cfg, rng)
    counts[kind] += 1
    result = rec.act(mistake, "noise")

    def unchanged() -> bool:
        same_valid = valid_before is None or _valid_set(rec.obs) == valid_before
        return same_valid and rec.score == score_before and not rec.done

    outside_valid = mistake.kind == "command" and valid_before is not None and _norm(mistake.text) not in valid_before
    if (result.observation.error or outside_valid or is_look_only(mistake)) and unchanged():
        return "kept_unchanged"
    if expert.policy is not None and not rec.done:
        return "kept_changed"  # a policy answers the real state: it recovers from here
    if not rec.done:
        inverse = _pick_inverse(mistake, rec.obs)
        if inverse is not None:
            rec.act(inverse, "recovery")
            if unchanged():
                return "kept_inverse"
    # Off the plan with no sound way back: keep the real steps as a branch, restore the main run.
    tag = f"{rec.spec.policy}{rec.spec.attempt}-{len(branches)}"
    branches.append(_branch_record(rec, rec.steps, start, tag))
    if not rec.restore(start):
        counts["replay_mismatch"] += 1
    return "split"


def _pick_inverse(mistake: Action, obs: Observation) -> Action | None:
    candidates = inverse_candidates(mistake)
    if obs.valid_actions is not None:
        valid = {_norm(v) for v in obs.valid_actions}
        candidates = [c for c in candidates if _norm(c) in valid]
    return Action.command(candidates[0]) if candidates else None


def _random_action(rec: Recorder, pool: dict[str, list[Any]], rng: random.Random, avoid: Action | None) -> Action:
    obs = rec.obs
    if obs.valid_actions:
        choices = [
            v for v in obs.valid_actions if avoid is None or avoid.kind != "command" or _norm(v) != _norm(avoid.text)
        ]
        return Action.command(rng.choice(choices or obs.valid_actions))
    if obs.tools:
        call = random_tool_call(obs.tools, pool, rng)
        if call is not None:
            return call
        return invalid_tool_call(obs.tools, rng)
    return Action.command(invalid_command(None, rng))


def run_random(rec: Recorder, expert: Expert, cfg: CollectConfig, rng: random.Random) -> list[Trajectory]:
    pool = _argument_pool(expert.path)
    steps = min(cfg.random_steps, cfg.max_steps)
    while len(rec.steps) < steps and not rec.done:
        rec.act(_random_action(rec, pool, rng, None), "random")
    return [rec.finish(truncated=True)]


def run_branch(rec: Recorder, expert: Expert, cfg: CollectConfig, rng: random.Random) -> list[Trajectory]:
    """Play a random-length expert prefix, then one random non-expert action."""
    plan = expert.path
    k = rng.randrange(min(len(plan), cfg.max_steps)) if plan else 0
    for i in range(k):
        if rec.done or (action := expert.next(rec, i)) is None:
            break
        rec.act(action, "expert")
    branch_step = len(rec.steps)
    if not rec.done:
        avoid = expert.next(rec, branch_step)
        rec.act(_random_action(rec, _argument_pool(plan), rng, avoid), "random")
    traj = rec.finish()
    traj.meta.update(kind="branch", branch_step=branch_step)
    return [traj]


def run_losing_branch(rec: Recorder, expert: Expert, cfg: CollectConfig, rng: random.Random) -> list[Trajectory]:
    """Branch from the expert path into an action that loses the episode (module docstring)."""
    plan = expert.path[: cfg.max_steps]
    listed = []  # the valid actions at each point of the expert path
    for action in plan:
        if rec.done:
            break
        listed.append(rec.obs.valid_actions)
        rec.act(action, "expert")
    tries = [
        (k, text)
        for k, valid in enumerate(listed)
        for text in valid or []
        if _norm(text) != _norm(plan[k].text) and not is_look_only(Action.command(text))
    ]
    rng.shuffle(tries)
    rec.restore(0)
    if not tries:  # nothing listed to try (a tool env): an ordinary branch
        traj = run_branch(rec, expert, cfg, rng)[0]
        traj.meta["losing"] = False
        return [traj]
    for n, (k, text) in enumerate(tries[: cfg.losing_tries], start=1):
        if n > 1:
            rec.restore(0)
        for action in plan[:k]:
            rec.act(action, "expert")
        result = rec.act(Action.command(text), "noise")
        if result.done and not result.won:
            break
    traj = rec.finish()
    traj.meta.update(kind="branch", branch_step=k, losing=bool(result.done and not result.won), tries=n)
    return [traj]


def run_episode(env: Env, spec: EpisodeSpec, cfg: CollectConfig) -> EpisodeOutcome:
    """Collect one episode (plus its split-off branches); an env exception yields an errored record."""
    rng = random.Random(f"{cfg.seed}:{spec.id}")
    meta = {"seed": cfg.seed, "collector": "simplan.collect", "kind": "episode"}
    if spec.policy == "noisy_expert":
        meta.update(noise_rate=cfg.noise_rate, invalid_share=cfg.invalid_share)
    if cfg.env_kwargs:
        meta["env_kwargs"] = _jsonable(cfg.env_kwargs)
    t0 = time.perf_counter()
    rec: Recorder | None = None
    try:
        rec = Recorder(env, spec, meta)
        plain_expert = spec.policy == "expert" and not spec.attempt.startswith(("branch", "lose"))
        expert = make_expert(env, rec, cfg, needs_path=not plain_expert)
        rec.traj.meta["expert"] = expert.kind
        if spec.attempt.startswith("branch"):
            trajs = run_branch(rec, expert, cfg, rng)
        elif spec.attempt.startswith("lose"):
            trajs = run_losing_branch(rec, expert, cfg, rng)
        elif spec.policy == "expert":
            trajs = run_expert(rec, expert, cfg)
        elif spec.policy == "noisy_expert":
            trajs = run_noisy(rec, expert, cfg, rng)
        else:
            trajs = run_random(rec, expert, cfg, rng)
        trajs[0].meta["expert_plan_len"] = len(expert.path) if expert.path or expert.policy is None else len(rec.steps)
        crashed = False
    except Exception as e:  # noqa: BLE001 - any env failure is recorded, never dropped
        message = f"{type(e).__name__}: {e}"
        if rec is None:
            traj = Trajectory(
                id=spec.id, env=spec.task.env, task=spec.task, goal="", policy=spec.policy,
                initial_observation="", meta=dict(meta),
            )  # fmt: skip
        else:
            traj = rec.traj
            traj.success, traj.final_score = False, rec.score
        traj.status, traj.error = "errored", message
        traj.meta["traceback"] = traceback.format_exc(limit=8)[-4000:]
        trajs, crashed = [traj], True
    elapsed = time.perf_counter() - t0
    trajs[0].meta["elapsed_s"] = round(elapsed, 4)
    transitions = sum(len(t.steps) - int(t.meta.get("branch_step", 0)) for t in trajs if t.status != "errored")
    return EpisodeOutcome(
        id=spec.id,
        records=[t.to_dict() for t in trajs],
        status=trajs[0].status,
        transitions=transitions,
        env_steps=rec.env_steps if rec is not None else 0,
        crashed=crashed,
    )


# ---------------------------------------------------------------------------------------------
# Workers: one env per process, created once and reused; recreated after a crash.
# ---------------------------------------------------------------------------------------------
class EnvHolder:
    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.name, self.kwargs = name, kwargs
        self.env: Env | None = None

    def get(self) -> Env:
        if self.env is None:
            self.env = make_env(self.name, **self.kwargs)
        return self.env

    def discard(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a crashed env may fail to close; it is dropped anyway
                pass

    def run(self, spec: EpisodeSpec, cfg: CollectConfig) -> EpisodeOutcome:
        try:
            env = self.get()
        except Exception as e:  # noqa: BLE001 - recorded as an errored episode
            traj = Trajectory(
                id=spec.id, env=spec.task.env, task=spec.task, goal="", policy=spec.policy, initial_observation="",
                status="errored", error=f"could not create env {self.name!r}: {type(e).__name__}: {e}",
                meta={"seed": cfg.seed, "collector": "simplan.collect", "kind": "episode"},
            )  # fmt: skip
            return EpisodeOutcome(spec.id, [traj.to_dict()], "errored", 0, 0, crashed=True)
        outcome = run_episode(env, spec, cfg)
        if outcome.crashed:
            self.discard()
        return outcome


_WORKER: EnvHolder | None = None


def _worker_init(name: str, kwargs: dict[str, Any], factory: Any = None) -> None:
    global _WORKER
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if factory is not None:  # an env registered at run time: a spawned worker must register it again
        registry.register(name, factory)
    _WORKER = EnvHolder(name, kwargs)


def _worker_run(spec: EpisodeSpec, cfg: CollectConfig) -> EpisodeOutcome:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.run(spec, cfg)


# ---------------------------------------------------------------------------------------------
# Resume and the main loop
# ---------------------------------------------------------------------------------------------
@dataclass
class CollectReport:
    out: str
    planned: int = 0
    skipped: int = 0
    written: int = 0
    records: int = 0
    transitions: int = 0
    env_steps: int = 0
    elapsed_s: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    success: Counter = field(default_factory=Counter)  # policy -> successful main episodes
    episodes: Counter = field(default_factory=Counter)  # policy -> main episodes written
    problems: list[str] = field(default_factory=list)  # torn lines, unfinished episodes
    unfinished: int = 0
    losing: Counter = field(default_factory=Counter)  # losing branches written: "found" (lost the game) or "not"

    @property
    def transitions_per_s(self) -> float:
        return self.transitions / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        lines = [
            f"collect -> {self.out}",
            f"  episodes: {self.planned} planned, {self.skipped} already there, {self.written} written "
            f"({self.records} records with branches), {self.unfinished} unfinished",
            f"  status: {dict(self.statuses) or {}}",
            f"  transitions: {self.transitions} in {self.elapsed_s:.1f} s ({self.transitions_per_s:.1f}/s); "
            f"env steps incl. replays: {self.env_steps}",
        ]
        for policy, n in sorted(self.episodes.items()):
            lines.append(f"  {policy}: {self.success[policy]}/{n} succeeded")
        if self.losing:
            found, total = self.losing["found"], self.losing["found"] + self.losing["not"]
            lines.append(f"  losing branches: {found}/{total} lost the game (the rest are ordinary branches)")
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)


def _repair_tail(path: Path, problems: list[str]) -> list[str]:
    """Move a torn last line (a crash mid-append) to `{out}.torn` so appending can continue."""
    if not path.exists() or path.stat().st_size == 0:
        return problems
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return problems
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        json.loads(tail)
        with open(path, "ab") as f:  # a whole record that only lacks its newline
            f.write(b"\n")
        return problems
    except ValueError:
        pass
    with open(f"{path}.torn", "ab") as f:
        f.write(tail + b"\n")
    with open(path, "r+b") as f:
        f.truncate(cut)
    lineno = data[:cut].count(b"\n") + 1
    return [
        p if not p.startswith(f"{path}:{lineno}:") else f"{p}; moved to {path}.torn and collected again"
        for p in problems
    ]


def load_done(path: Path, retry_errored: bool) -> tuple[set[str], list[str]]:
    """Episode ids already in `path` (and problems found reading it)."""
    records, problems = read_jsonl_tolerant(path)
    problems = _repair_tail(path, problems)
    if retry_errored:
        errored = {r.get("id") for r in records if isinstance(r, dict) and r.get("status") == "errored"}
        if errored:
            keep = [
                r
                for r in records
                if not (
                    isinstance(r, dict) and (r.get("id") in errored or (r.get("meta") or {}).get("parent") in errored)
                )
            ]
            if not problems:  # never rewrite a file with unreadable lines: they would be lost
                write_jsonl(path, keep)
                records = keep
            else:
                problems.append(f"{path}: not retrying errored episodes while the file has unreadable lines")
    done = {r["id"] for r in records if isinstance(r, dict) and isinstance(r.get("id"), str)}
    return done, problems


def _outcomes(cfg: CollectConfig, todo: list[EpisodeSpec]) -> Iterator[EpisodeOutcome]:
    if cfg.workers == 1:
        holder = EnvHolder(cfg.env, cfg.env_kwargs)
        try:
            for spec in todo:
                yield holder.run(spec, cfg)
        finally:
            holder.discard()
        return
    # spawn: a fresh interpreter per worker; forking a process that talks to a JVM is unsafe.
    with ProcessPoolExecutor(
        max_workers=cfg.workers,
        mp_context=get_context("spawn"),
        initializer=_worker_init,
        initargs=(cfg.env, cfg.env_kwargs, registry._REGISTERED.get(cfg.env)),
    ) as pool:
        # Keep a bounded number of episodes in flight so results stream back in order of completion.
        pending, queue = set(), iter(todo)
        for spec in queue:
            pending.add(pool.submit(_worker_run, spec, cfg))
            if len(pending) >= 4 * cfg.workers:
                break
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                yield fut.result()
                nxt = next(queue, None)
                if nxt is not None:
                    pending.add(pool.submit(_worker_run, nxt, cfg))


def collect(cfg: CollectConfig) -> CollectReport:
    """Collect every planned episode not yet in `cfg.out`; returns counts (see `CollectReport.summary`)."""
    from tqdm.auto import tqdm

    out = Path(cfg.out)
    report = CollectReport(out=str(out))
    env = make_env(cfg.env, **cfg.env_kwargs)
    try:
        tasks = select_tasks(env, cfg)
    finally:
        env.close()
    if not tasks:
        raise ValueError(f"no {cfg.fold} tasks in {cfg.env} for families={cfg.families}; check --families/--fold")
    specs = plan_episodes(tasks, cfg)
    done, report.problems = load_done(out, cfg.retry_errored)
    todo = [s for s in specs if s.id not in done]
    report.planned, report.skipped = len(specs), len(specs) - len(todo)
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), unit="ep", desc=f"collect {cfg.env}/{cfg.fold}", disable=not cfg.progress)
    try:
        for outcome in _outcomes(cfg, todo) if todo else ():
            append_jsonl(out, outcome.records)
            main = outcome.records[0]
            report.written += 1
            report.records += len(outcome.records)
            report.transitions += outcome.transitions
            report.env_steps += outcome.env_steps
            report.statuses[outcome.status] += 1
            report.episodes[main["policy"]] += 1
            report.success[main["policy"]] += int(main["success"])
            if "losing" in main["meta"]:
                report.losing["found" if main["meta"]["losing"] else "not"] += 1
            bar.update(1)
            bar.set_postfix(trans=report.transitions, err=report.statuses["errored"], refresh=False)
    except BrokenProcessPool as e:
        report.problems.append(f"a worker process died ({e}); re-run the same command to resume")
    finally:
        bar.close()
        report.elapsed_s = time.perf_counter() - t0
        report.unfinished = len(todo) - report.written
    return report

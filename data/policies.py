"""The collection policies: expert, noisy expert, random, branches and losing branches, each over a Recorder.

    from simplan.data.policies import make_expert, run_noisy
    expert = make_expert(env, rec, cfg, needs_path=True)
    trajectories = run_noisy(rec, expert, cfg, rng)        # the main record first, then split-off branches

Each `run_*` plays one episode into a `Recorder` (data/recorder.py) and returns its records, the main
one first; `cfg` is the `CollectConfig` (data/collect.py), `rng` the episode's seeded random source.

The expert is the env's reacting policy (`expert_action(observation)`, envs/base.py EnvDefaults) where
the adapter offers one, else its fixed `expert_plan()` (`Expert`). A policy is asked for each step at the
real state, so it recovers from what happened (a 503, a sold-out item, a noisy step); where a fixed path
is needed (argument values for random tool calls, where noise and branch points fall) it is the policy's
run from reset.

- ``expert`` (`run_expert`): the expert played from reset.
- ``noisy_expert`` (`run_noisy`): the expert with real mistakes. Before an expert step, with probability
  `noise_rate` (and at least `min_mistakes` times per episode), the collector plays a mistake
  instead: an *invalid* action (a plausible command outside the valid actions, an unknown tool or a
  call missing its arguments) or a *wrong valid* action (another valid action, or a read-only tool
  call); data/mistakes.py makes them. What happens next depends on what the mistake did to the state:

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
- ``random`` (`run_random`): uniformly random valid actions (random tool calls built from the tool schemas
  with argument values borrowed from the expert plan, for tool envs), `random_steps` steps at most.
- branches (`run_branch`, `branches > 0`): off-path coverage for the simulator. From a random point of the
  expert path, one random non-expert action is played and recorded after the replayed expert
  prefix (policy ``random``, attempt ``branch{k}``, `meta.branch_step` = index of the new step;
  steps before it repeat the expert path so the record keeps its real history).
- losing branches (`run_losing_branch`, `losing_branches > 0`): what irreversible mistakes lead to. From
  points of the expert path, listed actions other than the expert's (look-only ones left out) are tried,
  each after a reset and the replayed expert prefix, until one ends the episode unwon (TWX sorting's
  wrong item in the box, a wrong answer in arithmetic): that step, with the losing observation, is
  recorded after the prefix (policy ``random``, attempt ``lose{k}``, source ``noise``,
  `meta.losing = true`). At most `losing_tries` actions are tried; when none loses, the last one is
  kept as an ordinary branch (`meta.losing = false`), so every planned record exists and a resumed
  run does not search again. Envs that list no actions (tool envs) get an ordinary branch.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simplan.data.mistakes import (
    argument_pool,
    invalid_command,
    invalid_tool_call,
    inverse_candidates,
    is_look_only,
    norm_command,
    random_tool_call,
)
from simplan.data.recorder import Recorder, branch_record
from simplan.data.trajectory import Trajectory
from simplan.envs.base import Action, Env, Observation, expert_policy

if TYPE_CHECKING:  # the config module runs the policies: a type-only import, no cycle at run time
    from simplan.data.collect import CollectConfig


def _valid_set(obs: Observation) -> frozenset[str] | None:
    return None if obs.valid_actions is None else frozenset(norm_command(v) for v in obs.valid_actions)


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
        ahead = {norm_command(a.text) for a in remaining if a.kind == "command"}
        others = [v for v in obs.valid_actions if norm_command(v) not in ahead]
        if others and not want_invalid:
            return Action.command(rng.choice(others)), "wrong"
        return Action.command(invalid_command(obs.valid_actions, rng)), "invalid"
    if obs.tools:
        if not want_invalid:
            call = random_tool_call(obs.tools, argument_pool(plan), rng, read_only=rng.random() < 0.5)
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

    outside_valid = (
        mistake.kind == "command" and valid_before is not None and norm_command(mistake.text) not in valid_before
    )
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
    branches.append(branch_record(rec, rec.steps, start, tag))
    if not rec.restore(start):
        counts["replay_mismatch"] += 1
    return "split"


def _pick_inverse(mistake: Action, obs: Observation) -> Action | None:
    candidates = inverse_candidates(mistake)
    if obs.valid_actions is not None:
        valid = {norm_command(v) for v in obs.valid_actions}
        candidates = [c for c in candidates if norm_command(c) in valid]
    return Action.command(candidates[0]) if candidates else None


def _random_action(rec: Recorder, pool: dict[str, list[Any]], rng: random.Random, avoid: Action | None) -> Action:
    obs = rec.obs
    if obs.valid_actions:
        choices = [
            v
            for v in obs.valid_actions
            if avoid is None or avoid.kind != "command" or norm_command(v) != norm_command(avoid.text)
        ]
        return Action.command(rng.choice(choices or obs.valid_actions))
    if obs.tools:
        call = random_tool_call(obs.tools, pool, rng)
        if call is not None:
            return call
        return invalid_tool_call(obs.tools, rng)
    return Action.command(invalid_command(None, rng))


def run_random(rec: Recorder, expert: Expert, cfg: CollectConfig, rng: random.Random) -> list[Trajectory]:
    pool = argument_pool(expert.path)
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
        rec.act(_random_action(rec, argument_pool(plan), rng, avoid), "random")
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
        if norm_command(text) != norm_command(plan[k].text) and not is_look_only(Action.command(text))
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

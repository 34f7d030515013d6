"""Simulator rows of counterfactual alternatives: the other actions played from a state, behind one shared prefix.

    from simplan.data.build_branches import branch_rows
    rows, outcomes = branch_rows(trajectory, state, renderer, cfg, seen)   # simulator with --outcomes true

`simplan counterfactuals` records, on each step of a trajectory, what other actions really led to from the state
before that step (`Step.alternatives`, data/trajectory.py). For the simulator each alternative is one more
transition to learn: the conversation up to that state, the alternative action as the user turn and what it led
to (its outcome line and observation) as the assistant turn. Every alternative of one state shares the whole
conversation before it, so a row holds that prefix once (`messages`, no loss on it: its own turns are trained in
the path's windows) and the alternatives as `branches` (action, reply); the trainer packs them behind the prefix
with a tree attention mask (training/packing.py), so the state is encoded once however many alternatives it has.

Class balance: most alternatives of a text game change nothing, while the rare endings are what the planner must
foresee. Every alternative that is not "no change" is kept; at most `cfg.no_change_per_state` of those that are
(the first ones in recorded order, which counterfactual collection sampled at random).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from simplan.data import format as fmt
from simplan.data.episode import ConversationRenderer, EpisodeState
from simplan.data.trajectory import Alternative, Trajectory
from simplan.envs.actions import render_action

if TYPE_CHECKING:
    from simplan.data.build import BuildConfig


def kept_alternatives(alternatives: list[Alternative], no_change_per_state: int) -> list[Alternative]:
    """The alternatives of one state that become training branches (module docstring: class balance)."""
    kept, no_change = [], 0
    for alt in alternatives:
        if alt.outcome == "no_change":
            no_change += 1
            if no_change > no_change_per_state:
                continue
        kept.append(alt)
    return kept


def _open_at(state: EpisodeState, t: int) -> EpisodeState:
    """The episode as it stood before step t was taken: turns up to t, the last one open."""
    turn = state.turns[t]
    return EpisodeState(state.turns[:t] + [replace(turn, action=None, next_observation=None, notes=list(turn.notes))])


def branch_rows(
    traj: Trajectory, state: EpisodeState, renderer: ConversationRenderer, cfg: BuildConfig, seen: set[bytes]
) -> tuple[list[dict[str, Any]], Counter]:
    """One row per (state, shared prefix) with alternatives; returns the rows and the count of branches per outcome.
    `seen` holds the digests of (fold, prefix, action) already written, so a state branched in two recorded
    trajectories (an expert path and a noisy one share their start) trains each alternative once."""
    rows: list[dict[str, Any]] = []
    outcomes: Counter = Counter()
    for t, step in enumerate(traj.steps):
        alternatives = kept_alternatives(step.alternatives, cfg.no_change_per_state)
        if not alternatives:
            continue
        before = _open_at(state, t)
        by_prefix: dict[str, tuple[fmt.Messages, list[dict[str, str]]]] = {}
        for alt in alternatives:
            action = render_action(alt.action)
            messages = renderer.simulator_messages(before, action)
            prefix, user = messages[:-1], messages[-1]
            key = hashlib.sha1(json.dumps([traj.task.fold, prefix, user], ensure_ascii=True).encode()).digest()
            if key in seen:
                continue
            seen.add(key)
            reply = fmt.observation_completion(alt.next_observation, outcome=alt.outcome)
            text = json.dumps(prefix, ensure_ascii=True)
            by_prefix.setdefault(text, (prefix, []))[1].append(
                {"action": user["content"], "reply": reply, "outcome": alt.outcome, "error": bool(alt.error)}
            )
            outcomes[alt.outcome] += 1
        for prefix, branches in by_prefix.values():
            rows.append({"messages": prefix, "step": t, "branches": branches})
    return rows, outcomes


def branch_messages(prefix: fmt.Messages, branch: dict[str, Any]) -> fmt.Messages:
    """The whole conversation of one branch: the shared prefix, the alternative action, its reply."""
    return [*prefix, {"role": "user", "content": branch["action"]}, {"role": "assistant", "content": branch["reply"]}]

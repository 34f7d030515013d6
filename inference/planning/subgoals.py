"""Sub-goals in the planning loop: one episode's belief state, which sub-goals are met, and the check of each
action against the first unmet one (`PlannerConfig.subgoals`; the env declares both halves, envs/subgoals.py).

    tracker = SubgoalTracker.start(env, goal)      # None when the env declares no sub-goals
    tracker.observe(action, facts)                 # after each real step, its facts: the belief updated
    tracker.rejected(action)                       # before an action runs: the conditions it contradicts
    ranked, event = tracker.screen(proposals)      # a decision's proposals, the contradicting ones handled

A decision (imagination.py) screens the decider's proposals before it routes and imagines them: a call that
contradicts the first unmet sub-goal is *repaired* when every condition it fails is an equality on one of its
arguments (the call as decoded under that constraint: `order(item='kettle-glass', qty=2)` becomes `qty=1` when
one kettle is asked for), and otherwise goes after the proposals that do not contradict it; a `finish` while a
sub-goal is unmet contradicts the goal itself. A queued action that contradicts it is the pivot
`subgoal_violation` before it runs, as `not_valid_now` is. Every screen that changed something, every step that
met a sub-goal and the sub-goals still unmet at the end go into the trace.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from simplan.envs.actions import render_action
from simplan.envs.base import Action, env_extra
from simplan.envs.subgoals import Belief, Condition, Fact, SubGoal, env_facts, first_unmet_rejects, unmet
from simplan.inference.planning.judge import is_finish
from simplan.inference.planning.proposals import Proposal
from simplan.inference.planning.trace_events import PivotEvent, SubgoalEvent

SUBGOAL_VIOLATION = "subgoal_violation"
UNMET_FINISH = Condition("finish", "==", "after every sub-goal is met")  # what a premature finish contradicts


def _name(env: Any) -> str:
    """The adapter's class name (under make_env's wrappers), for errors about its hooks."""
    return type(getattr(env, "unwrapped", env)).__name__


@dataclass
class SubgoalTracker:
    """The sub-goals of one episode and the belief state they are checked on."""

    env: Any
    goals: list[SubGoal]
    belief: Belief = dataclasses.field(default_factory=Belief)

    @classmethod
    def start(cls, env: Any, goal: str) -> SubgoalTracker | None:
        """The tracker of an episode just reset, or None when the env declares no sub-goals (or no facts)."""
        declare, facts = env_extra(env, "subgoals"), env_extra(env, "facts")
        if not (callable(declare) and callable(facts)):
            return None
        goals = list(declare(goal))
        wrong = [g for g in goals if not isinstance(g, SubGoal)]
        if wrong:
            raise TypeError(f"{_name(env)}.subgoals returned {wrong[0]!r}: expected SubGoal (envs/subgoals.py)")
        return cls(env, goals) if goals else None

    def facts(self, action: Action, observation: str | None, error: bool) -> list[Fact]:
        """The env's facts of a step (observation None: of the call's intent), checked to be Facts."""
        return env_facts(self.env, action, observation, error)

    @property
    def unmet(self) -> list[SubGoal]:
        return unmet(self.goals, self.belief)

    def unmet_names(self) -> list[str]:
        return [g.name for g in self.unmet]

    def observe(self, action: Action, facts: list[Fact]) -> SubgoalEvent | None:
        """Add a real step's facts (the env's facts of its observation, as the episode state holds them) to the
        belief; the event when the step met a sub-goal (else None)."""
        before = set(self.unmet_names())
        self.belief.add(facts)
        now = self.unmet_names()
        met = [g.name for g in self.goals if g.name in before and g.name not in now]
        if not met:
            return None
        return SubgoalEvent(
            check="step", subgoal=now[0] if now else "", unmet=now, met=met, actions=[render_action(action)]
        )

    def rejected(self, action: Action) -> list[Condition]:
        """The conditions of the first unmet sub-goal that the action's intended record fails ([]: it does not
        contradict it); a finish while a sub-goal is unmet fails UNMET_FINISH."""
        if is_finish(action.key()):
            return [UNMET_FINISH] if self.unmet else []
        return first_unmet_rejects(self.goals, self.belief, self.facts(action, None, False))

    def repair(self, action: Action, rejected: list[Condition]) -> Action | None:
        """The call with the arguments that the rejected equality conditions name set to their values, if that
        is every rejected condition and the result contradicts nothing; else None."""
        if action.kind != "tool_call" or not rejected:
            return None
        if any(c.op != "==" or c.field not in action.arguments for c in rejected):
            return None
        fixed = Action.tool_call(action.name or "", {**action.arguments, **{c.field: c.value for c in rejected}})
        return fixed if not self.rejected(fixed) else None

    def screen(
        self, proposals: list[Proposal], allowed: set[str] | None = None
    ) -> tuple[list[Proposal], SubgoalEvent | None]:
        """The proposals with every contradicting call repaired or put after those that do not contradict the first
        unmet sub-goal (the decider's order kept otherwise, duplicates dropped), and the event saying so (None
        when no proposal contradicts it). `allowed`: the keys of the real state's valid actions where the env lists
        them all; a repair outside them is no repair."""
        pending = self.unmet
        if not pending or not proposals:
            return proposals, None
        kept: list[Proposal] = []
        demoted: list[Proposal] = []
        flagged: list[str] = []
        conditions: list[str] = []
        repaired: dict[str, str] = {}
        for p in proposals:
            rejected = self.rejected(p.action)
            if not rejected:
                kept.append(p)
                continue
            text = render_action(p.action)
            flagged.append(text)
            conditions += [c.describe() for c in rejected if c.describe() not in conditions]
            fixed = self.repair(p.action, rejected)
            if fixed is not None and (allowed is None or fixed.key() in allowed):
                repaired[text] = render_action(fixed)
                kept.append(dataclasses.replace(p, action=fixed))
            else:
                demoted.append(p)
        if not flagged:
            return proposals, None
        ranked: list[Proposal] = []
        seen: set[str] = set()
        for p in kept + demoted:
            if p.action.key() not in seen:
                seen.add(p.action.key())
                ranked.append(p)
        event = SubgoalEvent(
            check="screen",
            subgoal=pending[0].name,
            unmet=[g.name for g in pending],
            actions=flagged,
            rejected=conditions,
            repaired=repaired,
            top=render_action(ranked[0].action),
        )
        return ranked, event

    def violation(self, action: Action) -> PivotEvent | None:
        """The pivot `subgoal_violation` (error) for a queued action that contradicts the first unmet sub-goal."""
        rejected = self.rejected(action)
        if not rejected:
            return None
        text = render_action(action)
        goal = self.unmet[0].name
        failed = [c.describe() for c in rejected]
        return PivotEvent(
            rule=SUBGOAL_VIOLATION,
            severity="error",
            evidence={"action": text, "subgoal": goal, "rejected": failed},
            message=f"{text!r} contradicts the sub-goal {goal!r}: {'; '.join(failed)}",
            fired=True,
        )

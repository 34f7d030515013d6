"""Sub-goals with acceptance checks, over a belief state of facts the env extracts from each step.

    from simplan.envs.subgoals import Belief, Condition, Fact, SubGoal
    goals = [SubGoal("ordered", "orders", (Condition("item", "startswith", "kettle-"), Condition("qty", "==", 2)))]
    belief = Belief()
    belief.add([Fact("orders", "A001", {"item": "kettle-steel", "qty": 1})])   # what a real step told
    unmet(goals, belief)                                        # [the "ordered" sub-goal]: qty is 1, not 2
    contradicted(goals[0], belief.merged([Fact("orders", None, {"item": "kettle-glass", "qty": 1})]))

An env declares both halves (envs/base.py EnvDefaults): `subgoals(goal)`, the goal's sub-goals in the order they
are met, each a collection of the belief and the conditions one record of it must satisfy; and
`facts(action, observation, error)`, what a step tells about the world, as records of collections keyed by an
id (a tool's result by call: the shop's orders). With `observation=None` the env says what the call *intends*
(its arguments as the record it would write), so a call can be checked before it runs.

A sub-goal is met when one record of its collection satisfies every condition. A record *contradicts* a
sub-goal when it sets a field that a condition rejects: ordering 2 kettles contradicts "order 1 kettle", and so
does shipping an order of 2. The planner (inference/planning/subgoals.py) keeps the belief, traces which
sub-goals are met, and checks each action against the first unmet one before it runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simplan.envs.actions import render_action

if TYPE_CHECKING:
    from simplan.envs.base import Action

OPS: tuple[str, ...] = ("==", "!=", "in", "startswith", ">=", "<=")


@dataclass(frozen=True)
class Condition:
    """One machine-checkable test of a record's field: `field op value` (OPS)."""

    field: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"condition on {self.field!r}: operator {self.op!r} is not one of {', '.join(OPS)}")

    def holds(self, record: dict[str, Any]) -> bool:
        """Whether the record satisfies the condition (a record without the field does not)."""
        if self.field not in record:
            return False
        x, v = record[self.field], self.value
        try:
            if self.op == "==":
                return bool(x == v)
            if self.op == "!=":
                return bool(x != v)
            if self.op == "in":
                return x in v
            if self.op == "startswith":
                return isinstance(x, str) and x.startswith(str(v))
            if self.op == ">=":
                return bool(x >= v)
            return bool(x <= v)
        except TypeError:  # a value of another type (a string quantity) does not satisfy an order
            return False

    def describe(self) -> str:
        return f"{self.field} {self.op} {self.value!r}"


@dataclass(frozen=True)
class SubGoal:
    """A step toward the goal: some record of `collection` satisfies every condition."""

    name: str
    collection: str
    conditions: tuple[Condition, ...] = ()

    def met_by(self, record: dict[str, Any]) -> bool:
        return all(c.holds(record) for c in self.conditions)

    def met(self, belief: Belief) -> bool:
        return any(self.met_by(r) for r in belief.records(self.collection))

    def rejected(self, record: dict[str, Any]) -> list[Condition]:
        """The conditions on fields the record sets that it fails (those on fields it lacks are not judged)."""
        return [c for c in self.conditions if c.field in record and not c.holds(record)]

    def describe(self) -> str:
        return f"{self.name}: a {self.collection} record with " + " and ".join(c.describe() for c in self.conditions)


@dataclass(frozen=True)
class Fact:
    """Fields of one record of a collection; `key` None: a new record (its id not known yet). With `drop`, the
    record is gone instead (a TWX item put down), and `key` None drops the whole collection (an inventory listed
    afresh)."""

    collection: str
    key: str | None
    fields: dict[str, Any] = field(default_factory=dict)
    drop: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The fact as trajectories record it (data/trajectory.py Step.facts)."""
        d: dict[str, Any] = {"collection": self.collection, "key": self.key, "fields": dict(self.fields)}
        if self.drop:
            d["drop"] = True
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Fact:
        return Fact(str(d["collection"]), d.get("key"), dict(d.get("fields") or {}), bool(d.get("drop", False)))


@dataclass
class Belief:
    """What the agent knows as facts: records by collection and key, updated with each real step's facts."""

    collections: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def add(self, facts: Iterable[Fact]) -> None:
        for fact in facts:
            if fact.drop:
                if fact.key is None:
                    self.collections.pop(fact.collection, None)
                else:
                    self.collections.get(fact.collection, {}).pop(fact.key, None)
                continue
            records = self.collections.setdefault(fact.collection, {})
            key = fact.key if fact.key is not None else f"#{len(records) + 1}"
            records.setdefault(key, {}).update(fact.fields)

    def records(self, collection: str) -> list[dict[str, Any]]:
        return list(self.collections.get(collection, {}).values())

    def merged(self, facts: Iterable[Fact]) -> list[tuple[str, dict[str, Any]]]:
        """Each fact's record as it would stand after the fact: (collection, the existing record updated)."""
        out = []
        for fact in facts:
            existing = self.collections.get(fact.collection, {}).get(fact.key or "", {})
            out.append((fact.collection, {**existing, **fact.fields}))
        return out

    def to_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {c: {k: dict(r) for k, r in records.items()} for c, records in self.collections.items()}


def env_facts(env: object, action: Action | None, observation: str | None, error: bool) -> list[Fact]:
    """The env's facts of an observation (`EnvDefaults.facts`; `action` None: the reset observation, `observation`
    None: what the call intends), checked to be Facts; [] when the env declares no extractor."""
    from simplan.envs.base import env_extra

    extract = env_extra(env, "facts")
    if not callable(extract):
        return []
    facts = list(extract(action, observation, error))
    wrong = [f for f in facts if not isinstance(f, Fact)]
    if wrong:
        name = type(getattr(env, "unwrapped", env)).__name__
        shown = "the reset observation" if action is None else repr(render_action(action))
        raise TypeError(f"{name}.facts({shown}) returned {wrong[0]!r}: expected Fact (envs/subgoals.py)")
    return facts


def describe_belief(belief: Belief) -> list[str]:
    """The belief as prompt lines, one per collection in the order it was first written: `collection: record;
    record`, a record its key and its fields (`key (field: value, ...)`), its key alone when it has no fields, its
    field values alone when its key is "" (a collection of one record: the TWX location). Empty collections are
    left out."""
    lines = []
    for collection, records in belief.collections.items():
        shown = [_describe_record(key, fields) for key, fields in records.items()]
        if shown:
            lines.append(f"{collection}: " + ("; " if any(records.values()) else ", ").join(shown))
    return lines


def _describe_record(key: str, fields: dict[str, Any]) -> str:
    values = ", ".join(f"{name}: {value}" for name, value in fields.items())
    if not key:
        return ", ".join(str(v) for v in fields.values())
    return f"{key} ({values})" if fields else key


def unmet(goals: Iterable[SubGoal], belief: Belief) -> list[SubGoal]:
    """The sub-goals no record meets yet, in their order."""
    return [g for g in goals if not g.met(belief)]


def contradicted(goal: SubGoal, records: Iterable[tuple[str, dict[str, Any]]]) -> list[Condition]:
    """The conditions of `goal` that records of its collection (`Belief.merged`'s pairs) reject."""
    out: list[Condition] = []
    for collection, record in records:
        if collection == goal.collection:
            out += [c for c in goal.rejected(record) if c not in out]
    return out


def first_unmet_rejects(goals: Iterable[SubGoal], belief: Belief, intended: Iterable[Fact]) -> list[Condition]:
    """The conditions of the first unmet sub-goal that a call's intended facts (`facts(action, None, False)`)
    reject, as the planner checks a call before it runs; [] when every sub-goal is met."""
    pending = unmet(goals, belief)
    return contradicted(pending[0], belief.merged(intended)) if pending else []


def fact_differences(predicted: Iterable[Fact], real: Iterable[Fact]) -> list[str]:
    """Where a step's real facts depart from the facts of its predicted observation: a predicted record written
    under another key, with another value in a field both have, or not written at all (one line each)."""
    real = list(real)
    out: list[str] = []
    for p in predicted:
        same = [r for r in real if r.collection == p.collection]
        if not same:
            out.append(f"{p.collection}: expected {p.fields!r}, nothing written")
            continue
        r = next((r for r in same if r.key == p.key), same[0])
        if p.key is not None and r.key != p.key:
            out.append(f"{p.collection}: expected key {p.key!r}, got {r.key!r}")
        for name, value in p.fields.items():
            if name in r.fields and r.fields[name] != value:
                out.append(f"{p.collection} {r.key or ''}.{name}: expected {value!r}, got {r.fields[name]!r}")
    return out

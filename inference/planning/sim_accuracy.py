"""How often the simulator predicts the next observation exactly, per action verb: where to trust it.

`simplan eval-model --role simulator` counts it offline on a dataset fold and writes
`simulator_accuracy.json` (verb -> {n, exact, accuracy}) into its output folder, and with
`--write_adapter_accuracy true` next to the adapter, where the planner's selective router reads it
(PlannerConfig.router, inference/planning/config.py). `accuracy_from_traces` counts the same online,
from the real steps of evaluation traces whose outcome had been imagined.

    table = SimulatorAccuracy.from_pairs([("take key", True), ("go east", False)])
    table.write(Path(adapter_dir) / ACCURACY_FILE)
    SimulatorAccuracy.read(path).accuracy("take", min_rows=10)   # -> (0.9, "take: 9/10 exact")

A verb is the first word of a command, lower-cased, or the tool name of a tool call (`finish` for a
finish): the unit at which a simulator's reliability differs (TWX "go" is easy, "put" is not).
This module imports only the standard library, data/format.py's templates and trace records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.errors import InputError
from simplan.core.io import write_json
from simplan.data.format import CONVERSATION_SIMULATOR_SYSTEM, SECTION_ACTION
from simplan.inference.planning.trace import EpisodeTrace, predicted_exactly

ACCURACY_FILE = "simulator_accuracy.json"
_TOOL_CALL = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*\(")


def action_verb(text: str) -> str:
    """The verb of a rendered action: a tool call's name, else the first word lower-cased ("" for none)."""
    call = _TOOL_CALL.match(text or "")
    if call:
        return call.group(1)
    words = (text or "").split()
    return words[0].lower() if words else ""


def simulator_prompt_action(messages: list[dict[str, str]]) -> str:
    """The action a simulator prompt asks about, in either prompt layout (data/format.py, data/episode.py):
    the conversation format's last user turn is the action itself; the step format's user message holds
    it as its "Action: ..." section."""
    users = [m.get("content", "") for m in messages if m.get("role") == "user"]
    if not users:
        return ""
    system = messages[0].get("content", "") if messages[0].get("role") == "system" else ""
    if system.startswith(CONVERSATION_SIMULATOR_SYSTEM):
        return users[-1].strip()
    head = "\n\n" + SECTION_ACTION.format(action="")
    if head not in users[-1]:
        return ""
    return users[-1].rsplit(head, 1)[1].split("\n", 1)[0].strip()


@dataclass
class VerbCount:
    n: int = 0  # predictions of an action with this verb
    exact: int = 0  # of those, exactly the real observation

    @property
    def accuracy(self) -> float | None:
        return self.exact / self.n if self.n else None


@dataclass
class SimulatorAccuracy:
    """Exact predictions per action verb, and overall (their sums)."""

    verbs: dict[str, VerbCount] = field(default_factory=dict)

    @staticmethod
    def from_pairs(pairs: Iterable[tuple[str, bool]]) -> SimulatorAccuracy:
        """From (rendered action, prediction was exact) pairs."""
        verbs: dict[str, VerbCount] = {}
        for action, exact in pairs:
            count = verbs.setdefault(action_verb(action), VerbCount())
            count.n += 1
            count.exact += bool(exact)
        return SimulatorAccuracy(dict(sorted(verbs.items())))

    @property
    def overall(self) -> VerbCount:
        return VerbCount(sum(c.n for c in self.verbs.values()), sum(c.exact for c in self.verbs.values()))

    def accuracy(self, verb: str, min_rows: int = 1) -> tuple[float | None, str]:
        """(accuracy, evidence) for `verb`: its own where it has at least `min_rows` predictions, else the
        overall accuracy (the best guess for a verb seldom seen); None for an empty table."""
        own = self.verbs.get(verb)
        if own is not None and own.n >= max(1, min_rows):
            return own.accuracy, f"{verb}: {own.exact}/{own.n} exact"
        total = self.overall
        seen = f"{own.n} row(s)" if own is not None else "no rows"
        return total.accuracy, f"{verb or '(empty)'}: {seen}, overall {total.exact}/{total.n} exact"

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {
            v: {"n": c.n, "exact": c.exact, "accuracy": round(c.accuracy or 0.0, 6)} for v, c in self.verbs.items()
        }

    def write(self, path: str | Path) -> Path:
        write_json(path, self.to_dict())
        return Path(path)

    @staticmethod
    def read(path: str | Path) -> SimulatorAccuracy:
        """A table written by `write`; ValueError naming the file and the entry when it is not one."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not JSON ({e}); write it with `simplan eval-model --role simulator`") from None
        return SimulatorAccuracy.from_dict(data, where=str(path))

    @staticmethod
    def from_dict(data: Any, where: str = "simulator accuracy") -> SimulatorAccuracy:
        """From `to_dict`'s form (verb -> {n, exact}; `accuracy` is derived and ignored)."""
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected an object verb -> {{n, exact}}, got {type(data).__name__}")
        for verb, entry in data.items():
            ok = isinstance(entry, dict) and all(isinstance(entry.get(k), int) for k in ("n", "exact"))
            if not ok or not 0 <= entry["exact"] <= entry["n"]:
                raise InputError(f"{where}: entry {verb!r} is {entry!r}; a verb needs integer counts n >= exact >= 0")
        return SimulatorAccuracy({str(v): VerbCount(e["n"], e["exact"]) for v, e in sorted(data.items())})


def accuracy_from_traces(traces: Iterable[EpisodeTrace]) -> SimulatorAccuracy:
    """Online accuracy: every real step that had an expectation (a predicted observation), exact by the
    rule of the traces' own summary (trace.predicted_exactly: core.text.exact)."""
    pairs = []
    for trace in traces:
        for act in trace.of_type("act"):
            if act.expectation is not None:
                pairs.append((act.action, predicted_exactly(act)))
    return SimulatorAccuracy.from_pairs(pairs)

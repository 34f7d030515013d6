"""How long the pipeline's stages still to run will take: a guess per stage, each with where it comes from.

    clock = TimeLeft(earlier={"eval": 1800.0}, recipe={"train-decider": 480.0})
    clock.now["train-decider"] = 512.0                 # measured in this run
    print(clock.line(["train-simulator", "eval"]))     # 'time left: about 39 min (from earlier runs here: 1, ...)'

A stage's guess is the time it took when it last ran in this folder (its marker, workflows/stage_markers.py),
else the recipe's `estimates`, else the time its twin took in this run (train-simulator after train-decider).
"""

from __future__ import annotations

from dataclasses import dataclass, field

TWINS = {"collect-dev": "collect-train", "build-simulator": "build-decider", "train-simulator": "train-decider"}


@dataclass
class TimeLeft:
    """Guesses of how long stages take, each with its source (see the module docstring)."""

    earlier: dict[str, float]  # seconds, measured when the stage last ran in this folder
    recipe: dict[str, float]  # seconds, from PipelineConfig.estimates
    now: dict[str, float] = field(default_factory=dict)  # seconds, measured in this run

    def guess(self, name: str) -> tuple[float | None, str]:
        if name in self.earlier:
            return self.earlier[name], "earlier runs here"
        if name in self.recipe:
            return self.recipe[name], "recipe estimates"
        twin = TWINS.get(name)
        if twin in self.now:
            return self.now[twin], f"{twin} this run"
        return None, ""

    def line(self, stages: list[str]) -> str:
        """'about 23 min left (earlier runs here: 4 stages, recipe estimates: 2; no estimate for eval)'."""
        total = 0.0
        sources: dict[str, int] = {}
        unknown: list[str] = []
        for name in stages:
            seconds, source = self.guess(name)
            if seconds is None:
                unknown.append(name)
                continue
            total += seconds
            sources[source] = sources.get(source, 0) + 1
        if not sources:
            return f"time left: no estimate yet (set `estimates` in the recipe; unknown: {', '.join(unknown)})"
        parts = [f"{source}: {n}" for source, n in sources.items()]
        text = f"time left: about {duration(total)}{' or more' if unknown else ''} (from {', '.join(parts)}"
        return text + (f"; no estimate for {', '.join(unknown)})" if unknown else ")")


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"

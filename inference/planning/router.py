"""How much planning a task and a decision deserve: per-episode budgets and the horizon of each decision.

    budgets = Router(config).budgets(task, route)               # config.budgets, family and grade overrides
    route = Router(config, table).route(budgets, margin, steps_left, degraded="", verb="take")

`router.mode: selective` simulates a decision only where it can pay (the simulator's measured accuracy on the
top candidate's verb, inference/planning/sim_accuracy.py, or an unsure decider) and acts reactively elsewhere;
`always` simulates every decision the horizon allows (the adaptive skip aside).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simplan.core.errors import InputError
from simplan.envs.base import Task
from simplan.inference.planning.sim_accuracy import ACCURACY_FILE, SimulatorAccuracy

if TYPE_CHECKING:
    from simplan.inference.planning.config import PlannerConfig

ROUTERS = ("always", "selective")
ROUTER_RULES = ("either", "both")
ON_REPLAN_BUDGET = ("react", "stop")
FAMILY_BUDGET_KEYS = ("max_steps", "max_replans", "token_budget", "stall_steps", "horizon", "k")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class RouterConfig:
    """Which decisions are simulated: PlannerConfig's `router` section."""

    mode: str | None = field(
        default=None,
        metadata=_help(
            "(arm preset, else always) always: simulate every decision the horizon allows (adaptive may skip "
            "confident ones); selective: simulate only where `rule` says it can pay, act reactively elsewhere"
        ),
    )
    rule: str = field(
        default="either",
        metadata=_help(
            "selective: either (simulate where the simulator is reliable on the top candidate's verb, see "
            "accuracy, or where the decider is unsure, margin below confident_margin) or both (and)"
        ),
    )
    accuracy: float = field(
        default=0.5, metadata=_help("selective: exact-match accuracy on a verb at which the simulator is reliable")
    )
    min_rows: int = field(
        default=10, metadata=_help("selective: predictions a verb needs for its own accuracy; fewer: the overall")
    )
    simulator_accuracy: str = field(
        default="",
        metadata=_help(
            f"selective: the per-verb accuracy table ({ACCURACY_FILE}, `simplan eval-model --role simulator`); "
            "'' = the one in the simulator adapter's folder"
        ),
    )
    confident_margin: float = field(
        default=0.6,
        metadata=_help("adaptive and selective: top-1 minus top-2 probability at which the decider is confident"),
    )

    def __post_init__(self) -> None:
        if self.mode not in (None, *ROUTERS):
            raise ValueError(f"router.mode: {self.mode!r} is not one of {', '.join(ROUTERS)}")
        if self.rule not in ROUTER_RULES:
            raise ValueError(f"router.rule: {self.rule!r} is not one of {', '.join(ROUTER_RULES)}")
        for name, value, lo in (("accuracy", self.accuracy, 0.0), ("confident_margin", self.confident_margin, 0.0)):
            if not lo <= value <= 1.0:
                raise ValueError(f"router.{name}: must be in [0, 1], got {value!r}")
        if self.min_rows < 1:
            raise ValueError(f"router.min_rows: must be >= 1, got {self.min_rows!r}")


@dataclass
class BudgetConfig:
    """What one episode may spend: PlannerConfig's `budgets` section."""

    max_steps: int = field(default=50, metadata=_help("real actions per episode"))
    max_replans: int = field(default=10, metadata=_help("pivot-triggered replans per episode"))
    on_replan_budget: str = field(
        default="react",
        metadata=_help("when the replans are spent: react (act one decided step at a time) or stop the episode"),
    )
    token_budget: int = field(default=0, metadata=_help("model tokens (prompt + completion) per episode; 0 = none"))
    # Fitted on TWX devfit traces (bench/RESULTS.md "Ending a stalled episode"): the winners' longest stretch without
    # progress there is 3 steps; 8 is twice the smallest value that ends no winner.
    stall_steps: int = field(
        default=8,
        metadata=_help(
            "end the episode after this many real steps in a row without progress: no score above the best so "
            "far, no observation not seen before in the episode, no sub-goal met (status budget_stall); 0 = never"
        ),
    )
    # Generous on purpose: CPU evaluations measured 1,493 s per episode on average (bench/history/session-07.md,
    # 12 episodes sharing one hf engine); the budget ends an episode stuck in a loop, not a slow one.
    max_episode_seconds: float = field(
        default=3600.0,
        metadata=_help("wall-clock seconds per episode, checked between steps (status budget_time); 0 = none"),
    )
    family: dict = field(
        default_factory=dict,
        metadata=_help("per task family overrides, e.g. {cookingworld: {max_steps: 80, horizon: 4}}"),
    )

    def __post_init__(self) -> None:
        checks = [
            ("max_steps", self.max_steps >= 1, ">= 1"),
            ("max_replans", self.max_replans >= 0, ">= 0"),
            ("token_budget", self.token_budget >= 0, ">= 0 (0 = no limit)"),
            ("stall_steps", self.stall_steps >= 0, ">= 0 (0 = never)"),
            ("max_episode_seconds", self.max_episode_seconds >= 0, ">= 0 (0 = no limit)"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"budgets.{name}: must be {expected}, got {getattr(self, name)!r}")
        if self.on_replan_budget not in ON_REPLAN_BUDGET:
            raise ValueError(
                f"budgets.on_replan_budget: {self.on_replan_budget!r} is not one of {', '.join(ON_REPLAN_BUDGET)}"
            )
        for family, over in self.family.items():
            bad = set(over) - set(FAMILY_BUDGET_KEYS) if isinstance(over, dict) else {"<not a mapping>"}
            if bad:
                raise ValueError(
                    f"budgets.family[{family!r}]: unknown keys {sorted(bad)}; use {sorted(FAMILY_BUDGET_KEYS)}"
                )


@dataclass
class Budgets:
    max_steps: int
    max_replans: int
    token_budget: int  # 0 = no limit
    horizon: int
    k: int
    max_seconds: float = 0.0  # wall-clock seconds of the episode; 0 = no limit
    stall_steps: int = 0  # real steps in a row without progress that end the episode; 0 = never


@dataclass
class Route:
    """The router's answer for one decision: how deep to simulate, and the evidence."""

    horizon: int
    reason: str = ""  # why this horizon ('' when it is simply the budget's)
    route: str = ""  # router selective: "simulate" or "react"; "" where it was not asked
    verb: str = ""  # selective: the verb of the decider's top candidate
    accuracy: float | None = None  # selective: the simulator's measured accuracy on that verb


def load_simulator_accuracy(config: PlannerConfig, adapter_dirs: dict[str, str]) -> SimulatorAccuracy | None:
    """The selective router's per-verb accuracy table: `config.router.simulator_accuracy`, else the simulator
    adapter's own (`adapter_dirs`: adapter name -> folder, as engines expose them). None when the router
    does not need one (router always, or the env oracle as simulator, which is exact by construction).

    Raises ValueError naming the field and the command that writes the table when there is none."""
    if config.router.mode != "selective" or config.simulator == "env":
        return None
    if config.router.simulator_accuracy:
        path = Path(config.router.simulator_accuracy)
    else:
        folder = adapter_dirs.get(config.simulator_adapter or "")
        path = Path(folder) / ACCURACY_FILE if folder else None
    if path is None or not path.is_file():
        where = f"{path} does not exist" if path is not None else "the simulator has no adapter folder"
        raise InputError(
            f"PlannerConfig.router.simulator_accuracy: router selective needs the simulator's per-verb accuracy and "
            f"{where}; write it with `simplan eval-model --role simulator --adapter DIR --write_adapter_accuracy true`"
            f", or give --router.simulator_accuracy PATH/{ACCURACY_FILE}"
        )
    table = SimulatorAccuracy.read(path)
    if not table.overall.n:
        raise InputError(
            f"PlannerConfig.router.simulator_accuracy: {path} holds no predictions; evaluate on a fold's rows"
        )
    return table


def gives_horizon(overrides: Iterable[dict[str, Any]]) -> bool:
    """Whether any of these budget overrides (a family's, a grade's route) lets a decision be simulated."""
    return any(int(o.get("horizon", 0)) > 0 for o in overrides)


class Router:
    """Decides how much planning a task deserves: budgets per task family, horizon per decision.

    `accuracy`: the simulator's per-verb accuracy (router selective with a learned simulator)."""

    def __init__(self, config: PlannerConfig, accuracy: SimulatorAccuracy | None = None) -> None:
        self.config = config
        self.accuracy = accuracy

    def budgets(self, task: Task, route: dict[str, Any] | None = None) -> Budgets:
        """The episode's budgets: the config's, then its task family's overrides, then `route`'s (the request's
        grade, inference/planning/grading.py)."""
        c, spend = self.config, self.config.budgets
        b = Budgets(
            spend.max_steps,
            spend.max_replans,
            spend.token_budget,
            c.horizon,
            c.k,
            spend.max_episode_seconds,
            spend.stall_steps,
        )
        for key, value in [*spend.family.get(task.family, {}).items(), *(route or {}).items()]:
            setattr(b, key, int(value))
        return b

    def route(self, budgets: Budgets, margin: float | None, steps_left: int, degraded: str, verb: str = "") -> Route:
        """The horizon of this decision; `degraded`: why the episode acts without simulation from now on ('' when
        it does not); `verb`: of the decider's top candidate (action_verb), for the selective router."""
        if budgets.horizon == 0:
            return Route(0)
        if degraded:
            return Route(0, f"{degraded}: acting without simulation")
        full = max(0, min(budgets.horizon, steps_left))
        c = self.config
        if c.router.mode == "selective":
            return self._selective(full, margin, verb)
        confident = c.router.confident_margin
        if c.adaptive and margin is not None and margin >= confident:
            return Route(0, f"decider confident (margin {margin:.2f} >= {confident}): no simulation")
        return Route(full)

    def _selective(self, horizon: int, margin: float | None, verb: str) -> Route:
        """Simulate where the simulator is reliable on the verb and/or (router.rule) the decider is unsure.

        A reliable simulator can catch a confident mistake (lost episodes mostly end on one wrong irreversible
        action); an unsure decider is where imagination can change the choice. An unknown margin (one sampled
        candidate) counts as unsure, as the adaptive rule never skips on it."""
        r = self.config.router
        if self.config.simulator == "env":
            accuracy, evidence = 1.0, "env oracle: exact"
        elif self.accuracy is None:
            raise ValueError("Router: router selective needs the simulator's accuracy table (simulator_accuracy)")
        else:
            accuracy, evidence = self.accuracy.accuracy(verb, r.min_rows)
        reliable = accuracy is not None and accuracy >= r.accuracy
        unsure = margin is None or margin < r.confident_margin
        simulate = (reliable or unsure) if r.rule == "either" else (reliable and unsure)
        shown = "unknown" if margin is None else f"{margin:.2f}"
        why = (
            f"router: simulator {'reliable' if reliable else 'unreliable'} ({evidence}; {r.accuracy} needed), "
            f"decider {'unsure' if unsure else 'confident'} (margin {shown}; {r.confident_margin} confident)"
        )
        if simulate:
            return Route(horizon, why + ": simulating", "simulate", verb, accuracy)
        return Route(0, why + ": acting reactively", "react", verb, accuracy)

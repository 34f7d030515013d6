"""Settings of the planning loop and the per-task budgets they imply (used by inference/planning/planner.py).

    config = PlannerConfig(arm="simplan", k=4, horizon=3)      # None fields come from the arm preset
    budgets = Router(config).budgets(task)                      # family_budgets applied for task.family
    route = Router(config, table).route(budgets, margin, steps_left, degraded="", verb="take")

`router: selective` simulates a decision only where it can pay (the simulator's measured accuracy on
the top candidate's verb, inference/planning/sim_accuracy.py, or an uncertain decider) and acts reactively elsewhere.

Every field has a default and a help string, so `simplan run` / `simplan eval` parse them from YAML
recipes and flags; `__post_init__` fills the arm preset (inference/planning/arms.py) and rejects bad values
naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simplan.core.text import SIMILARITIES
from simplan.data.episode import FORMATS, PromptSettings
from simplan.data.format import DEFAULT_MAX_FAILURES, DEFAULT_MAX_HISTORY
from simplan.envs.base import Task
from simplan.envs.failures import compile_patterns
from simplan.inference.planning.arms import ARMS, arm_preset
from simplan.inference.planning.judge import JudgeWeights
from simplan.inference.planning.sim_accuracy import ACCURACY_FILE, SimulatorAccuracy

DEFAULT_BUDGET = PromptSettings().budget
PROPOSE_MODES = ("auto", "score", "sample")
ON_REPLAN_BUDGET = ("react", "stop")
IMAGINED_ACTIONS = ("seen", "free")
SIMULATORS = ("model", "env")
ROUTERS = ("always", "selective")
ROUTER_RULES = ("either", "both")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class PlannerConfig:
    """Settings of the planning loop. Fields left at None come from the arm preset (inference/planning/arms.py)."""

    arm: str = field(default="simplan", metadata=_help(f"agent arm: {', '.join(ARMS)}"))
    k: int | None = field(default=None, metadata=_help("candidate first actions per decision (arm preset)"))
    horizon: int | None = field(default=None, metadata=_help("imagined steps per candidate, H (arm preset)"))
    pivots: bool | None = field(default=None, metadata=_help("watch real steps with the pivot rules (arm preset)"))
    adaptive: bool | None = field(
        default=None, metadata=_help("skip simulation when the decider is confident (arm preset)")
    )
    confident_margin: float = field(
        default=0.6,
        metadata=_help(
            "adaptive / router selective: top-1 minus top-2 probability at which the decider counts as confident"
        ),
    )
    router: str | None = field(
        default=None,
        metadata=_help(
            "(arm preset, else always) always: simulate every decision the horizon allows (adaptive may skip "
            "confident ones); selective: simulate only where router_rule says it can pay, act reactively "
            "elsewhere (replaces adaptive)"
        ),
    )
    router_rule: str = field(
        default="either",
        metadata=_help(
            "selective: either (simulate where the simulator is reliable on the top candidate's verb, see "
            "router_accuracy, or where the decider is unsure, margin below confident_margin) or both (and)"
        ),
    )
    router_accuracy: float = field(
        default=0.5,
        metadata=_help("selective: exact-match accuracy on a verb at which the simulator counts as reliable"),
    )
    router_min_rows: int = field(
        default=10,
        metadata=_help("selective: predictions a verb needs for its own accuracy; fewer: the overall accuracy"),
    )
    simulator_accuracy: str = field(
        default="",
        metadata=_help(
            f"selective: the per-verb accuracy table ({ACCURACY_FILE}, `simplan eval-model --role simulator`); "
            "'' = the one in the simulator adapter's folder"
        ),
    )
    propose: str = field(
        default="auto",
        metadata=_help("how the decider proposes: score valid actions, sample n=K, or auto (score when listed)"),
    )
    temperature: float = field(default=0.8, metadata=_help("sampling temperature of proposals (sample mode)"))
    top_p: float = field(default=0.95, metadata=_help("nucleus sampling of proposals (sample mode)"))
    decider_max_tokens: int = field(default=48, metadata=_help("max new tokens of a decider completion"))
    simulator_max_tokens: int = field(default=128, metadata=_help("max new tokens of a simulator completion"))
    simulator: str | None = field(
        default=None,
        metadata=_help(
            "who predicts imagined observations: model (the simulator adapter) or env (an oracle replaying the "
            "real env, inference/planning/oracle.py); None: the arm preset's, else model"
        ),
    )
    decider_adapter: str = field(default="decider", metadata=_help("engine adapter of the decider ('' = base)"))
    simulator_adapter: str = field(default="simulator", metadata=_help("engine adapter of the simulator ('' = base)"))
    # Prompt settings: None reads them from the adapters (prompt_settings.json, saved by `simplan train`);
    # a value that contradicts an adapter's is an error (inference/planning/prompts.py).
    prompt_format: str | None = field(
        default=None, metadata=_help("conversation or step; None: the adapters' (step for the base model)")
    )
    prompt_budget: int | None = field(
        default=None, metadata=_help(f"prompt tokens per window / prompt; None: the adapters' ({DEFAULT_BUDGET})")
    )
    max_history: int | None = field(
        default=None,
        metadata=_help(
            f"step format: history steps shown before the budget; None: the adapters' ({DEFAULT_MAX_HISTORY})"
        ),
    )
    imagined_actions: str = field(
        default="seen",
        metadata=_help("actions offered in imagined states: seen (valid actions seen so far, constrained) or free"),
    )
    max_steps: int = field(default=50, metadata=_help("real actions per episode"))
    max_replans: int = field(default=10, metadata=_help("pivot-triggered replans per episode"))
    on_replan_budget: str = field(
        default="react",
        metadata=_help("when the replans are spent: react (act one decided step at a time) or stop the episode"),
    )
    token_budget: int = field(default=0, metadata=_help("model tokens (prompt + completion) per episode; 0 = none"))
    # Generous on purpose: CPU evaluations measured 1,493 s per episode on average (bench/RESULTS.md, 12 episodes
    # sharing one hf engine); the budget is there to end an episode stuck in a loop, not a slow one.
    max_episode_seconds: float = field(
        default=3600.0,
        metadata=_help("wall-clock seconds per episode, checked between steps (status budget_time); 0 = none"),
    )
    family_budgets: dict = field(
        default_factory=dict,
        metadata=_help("per task family overrides, e.g. {cookingworld: {max_steps: 80, horizon: 4}}"),
    )
    mismatch_threshold: float = field(
        default=0.75, metadata=_help("expectation mismatch fires below this similarity (0..1)")
    )
    similarity: str = field(default="token_f1", metadata=_help(f"observation similarity: {', '.join(SIMILARITIES)}"))
    repeat_limit: int = field(default=3, metadata=_help("repeated_action: same action / same pair this many times"))
    no_progress_steps: int = field(default=8, metadata=_help("no_progress: steps without a score increase"))
    min_score_drop: float = field(default=0.0, metadata=_help("score_drop: fires when the score falls more"))
    budget_fraction: float = field(default=0.9, metadata=_help("budget_nearly_exhausted: fraction of a budget"))
    warning_threshold: int = field(default=2, metadata=_help("warnings that together fire a pivot"))
    max_transient_retries: int = field(
        default=2,
        metadata=_help(
            "transient_error: retries of a call that failed transiently (the env's transient_patterns), "
            "without a model call; past them the failure is permanent"
        ),
    )
    w_error: float = field(default=-2.0, metadata=_help("judge weight: predicted error/invalid outcome"))
    w_progress: float = field(default=1.0, metadata=_help("judge weight: predicted progress/reward"))
    w_repeat: float = field(default=-0.5, metadata=_help("judge weight: repeats of seen (action, observation)"))
    w_failed: float = field(default=-1.0, metadata=_help("judge weight: actions in the failure memory"))
    w_premature: float = field(
        default=-2.0, metadata=_help("judge weight: a finish whose imagined outcome is 'goal not met'")
    )
    w_lost: float = field(
        default=-10.0,
        metadata=_help(
            "judge weight (<= 0): a predicted step the env says ends the episode unwon (the env oracle's verdict, "
            "or a simulator trained with verdicts); large, so it outweighs progress and likelihood"
        ),
    )
    w_won: float = field(
        default=10.0,
        metadata=_help("judge weight (>= 0): a predicted step the env says wins (env oracle or simulator verdicts)"),
    )
    w_length: float = field(default=-0.05, metadata=_help("judge weight: per imagined step"))
    w_likelihood: float = field(default=0.5, metadata=_help("judge weight: decider probability of the 1st action"))
    w_confidence: float = field(
        default=0.0,
        metadata=_help(
            "judge: 0..1, how far a predicted outcome's parts shrink toward 0 as the simulator's confidence in "
            "it (geometric mean token probability) falls; 0 = predictions count whatever their confidence"
        ),
    )
    widen_lost: int = field(
        default=2,
        metadata=_help(
            "rounds of K more scored valid actions to imagine when every candidate's first step is predicted to "
            "lose the episode (verdicts: env oracle, or a simulator trained with them); 0 = take the best of "
            "the losing ones"
        ),
    )
    discount: float = field(default=0.9, metadata=_help("judge: weight of imagined step i is discount**i"))
    judge_threshold: float = field(
        default=-1.0, metadata=_help("below this total only the plan's first action is committed")
    )
    sim_cache: bool = field(default=True, metadata=_help("cache simulator predictions by (state, action)"))
    cache_history: int = field(default=2, metadata=_help("history steps that are part of a cached state's key"))
    max_failures: int | None = field(
        default=None,
        metadata=_help(f"failure-memory notes shown in prompts; None: the adapters' ({DEFAULT_MAX_FAILURES})"),
    )
    error_patterns: list[str] = field(
        default_factory=list, metadata=_help("extra regexes of error observations (added to the env's)")
    )
    progress_patterns: list[str] = field(
        default_factory=list, metadata=_help("extra regexes of progress observations (added to the env's)")
    )
    transient_patterns: list[str] = field(
        default_factory=list,
        metadata=_help("extra regexes of transient failures, retried as they are (added to the env's)"),
    )
    replan_patterns: list[str] = field(
        default_factory=list,
        metadata=_help("extra regexes of failures that change the plan: replan, no ban (added to the env's)"),
    )
    fallback_action: str = field(
        default="look", metadata=_help("action text when the decider gives nothing usable and no valid list exists")
    )
    sample_seed: int | None = field(default=0, metadata=_help("seed of proposal sampling (None: random)"))
    raise_errors: bool = field(default=False, metadata=_help("re-raise exceptions (the end event is written first)"))

    def __post_init__(self) -> None:
        for name, value in arm_preset(self.arm).items():  # validates the arm name
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.simulator is None:
            self.simulator = "model"
        if self.router is None:
            self.router = "always"
        checks = [
            ("k", self.k >= 1, ">= 1"),
            ("horizon", self.horizon >= 0, ">= 0"),
            ("widen_lost", self.widen_lost >= 0, ">= 0"),
            ("confident_margin", 0.0 <= self.confident_margin <= 1.0, "in [0, 1]"),
            ("temperature", self.temperature >= 0.0, ">= 0"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("decider_max_tokens", self.decider_max_tokens >= 1, ">= 1"),
            ("simulator_max_tokens", self.simulator_max_tokens >= 1, ">= 1"),
            ("prompt_budget", self.prompt_budget is None or self.prompt_budget >= 64, ">= 64"),
            ("max_history", self.max_history is None or self.max_history >= 0, ">= 0"),
            ("prompt_format", self.prompt_format in (None, *FORMATS), f"one of {', '.join(FORMATS)}"),
            ("max_steps", self.max_steps >= 1, ">= 1"),
            ("max_replans", self.max_replans >= 0, ">= 0"),
            ("on_replan_budget", self.on_replan_budget in ON_REPLAN_BUDGET, f"one of {ON_REPLAN_BUDGET}"),
            ("token_budget", self.token_budget >= 0, ">= 0 (0 = no limit)"),
            ("max_episode_seconds", self.max_episode_seconds >= 0, ">= 0 (0 = no limit)"),
            ("mismatch_threshold", 0.0 <= self.mismatch_threshold <= 1.0, "in [0, 1]"),
            ("repeat_limit", self.repeat_limit >= 2, ">= 2"),
            ("no_progress_steps", self.no_progress_steps >= 1, ">= 1"),
            ("min_score_drop", self.min_score_drop >= 0.0, ">= 0"),
            ("budget_fraction", 0.0 < self.budget_fraction <= 1.0, "in (0, 1]"),
            ("warning_threshold", self.warning_threshold >= 1, ">= 1"),
            ("max_transient_retries", self.max_transient_retries >= 0, ">= 0"),
            ("discount", 0.0 < self.discount <= 1.0, "in (0, 1]"),
            ("w_confidence", 0.0 <= self.w_confidence <= 1.0, "in [0, 1]"),
            ("w_lost", self.w_lost <= 0.0, "<= 0 (a penalty)"),
            ("w_won", self.w_won >= 0.0, ">= 0 (a bonus)"),
            ("router_accuracy", 0.0 <= self.router_accuracy <= 1.0, "in [0, 1]"),
            ("router_min_rows", self.router_min_rows >= 1, ">= 1"),
            ("cache_history", self.cache_history >= 0, ">= 0"),
            ("max_failures", self.max_failures is None or self.max_failures >= 0, ">= 0"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"PlannerConfig.{name}: must be {expected}, got {getattr(self, name)!r}")
        choices = [
            ("propose", PROPOSE_MODES),
            ("similarity", SIMILARITIES),
            ("imagined_actions", IMAGINED_ACTIONS),
            ("simulator", SIMULATORS),
            ("router", ROUTERS),
            ("router_rule", ROUTER_RULES),
        ]
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise ValueError(f"PlannerConfig.{name}: {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        budget_keys = {"max_steps", "max_replans", "token_budget", "horizon", "k"}
        for family, over in self.family_budgets.items():
            bad = set(over) - budget_keys if isinstance(over, dict) else {"<not a mapping>"}
            if bad:
                raise ValueError(
                    f"PlannerConfig.family_budgets[{family!r}]: unknown keys {sorted(bad)}; use {sorted(budget_keys)}"
                )
        compile_patterns(self.error_patterns + self.progress_patterns + self.transient_patterns + self.replan_patterns)

    def weights(self) -> JudgeWeights:
        return JudgeWeights(
            error=self.w_error,
            progress=self.w_progress,
            repeat=self.w_repeat,
            failed=self.w_failed,
            length=self.w_length,
            likelihood=self.w_likelihood,
            premature=self.w_premature,
            lost=self.w_lost,
            won=self.w_won,
            discount=self.discount,
            confidence=self.w_confidence,
        )


# ---------------------------------------------------------------------------------------------
# Router: per-episode budgets and the adaptive horizon
# ---------------------------------------------------------------------------------------------
@dataclass
class Budgets:
    max_steps: int
    max_replans: int
    token_budget: int  # 0 = no limit
    horizon: int
    k: int
    max_seconds: float = 0.0  # wall-clock seconds of the episode; 0 = no limit


@dataclass
class Route:
    """The router's answer for one decision: how deep to simulate, and the evidence."""

    horizon: int
    reason: str = ""  # why this horizon ('' when it is simply the budget's)
    route: str = ""  # router selective: "simulate" or "react"; "" where it was not asked
    verb: str = ""  # selective: the verb of the decider's top candidate
    accuracy: float | None = None  # selective: the simulator's measured accuracy on that verb


def load_simulator_accuracy(config: PlannerConfig, adapter_dirs: dict[str, str]) -> SimulatorAccuracy | None:
    """The selective router's per-verb accuracy table: `config.simulator_accuracy`, else the simulator
    adapter's own (`adapter_dirs`: adapter name -> folder, as engines expose them). None when the router
    does not need one (router always, or the env oracle as simulator, which is exact by construction).

    Raises ValueError naming the field and the command that writes the table when there is none."""
    if config.router != "selective" or config.simulator == "env":
        return None
    if config.simulator_accuracy:
        path = Path(config.simulator_accuracy)
    else:
        folder = adapter_dirs.get(config.simulator_adapter or "")
        path = Path(folder) / ACCURACY_FILE if folder else None
    if path is None or not path.is_file():
        where = f"{path} does not exist" if path is not None else "the simulator has no adapter folder"
        raise ValueError(
            f"PlannerConfig.simulator_accuracy: router selective needs the simulator's per-verb accuracy and {where}; "
            "write it with `simplan eval-model --role simulator --adapter DIR --write_adapter_accuracy true`, or "
            f"give --simulator_accuracy PATH/{ACCURACY_FILE}"
        )
    table = SimulatorAccuracy.read(path)
    if not table.overall.n:
        raise ValueError(f"PlannerConfig.simulator_accuracy: {path} holds no predictions; evaluate on a fold's rows")
    return table


class Router:
    """Decides how much planning a task deserves: budgets per task family, horizon per decision.

    `accuracy`: the simulator's per-verb accuracy (router selective with a learned simulator)."""

    def __init__(self, config: PlannerConfig, accuracy: SimulatorAccuracy | None = None) -> None:
        self.config = config
        self.accuracy = accuracy

    def budgets(self, task: Task) -> Budgets:
        c = self.config
        b = Budgets(
            c.max_steps,
            c.max_replans,
            c.token_budget,
            c.horizon,
            c.k,
            c.max_episode_seconds,  # type: ignore[arg-type]
        )
        for key, value in c.family_budgets.get(task.family, {}).items():
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
        if c.router == "selective":
            return self._selective(full, margin, verb)
        if c.adaptive and margin is not None and margin >= c.confident_margin:
            return Route(0, f"decider confident (margin {margin:.2f} >= {c.confident_margin}): no simulation")
        return Route(full)

    def _selective(self, horizon: int, margin: float | None, verb: str) -> Route:
        """Simulate where the simulator is reliable on the verb and/or (router_rule) the decider is unsure.

        A reliable simulator can catch a confident mistake (lost episodes mostly end on one wrong irreversible
        action); an unsure decider is where imagination can change the choice. An unknown margin (one sampled
        candidate) counts as unsure, as the adaptive rule never skips on it."""
        c = self.config
        if c.simulator == "env":
            accuracy, evidence = 1.0, "env oracle: exact"
        elif self.accuracy is None:
            raise ValueError("Router: router selective needs the simulator's accuracy table (simulator_accuracy)")
        else:
            accuracy, evidence = self.accuracy.accuracy(verb, c.router_min_rows)
        reliable = accuracy is not None and accuracy >= c.router_accuracy
        unsure = margin is None or margin < c.confident_margin
        simulate = (reliable or unsure) if c.router_rule == "either" else (reliable and unsure)
        shown = "unknown" if margin is None else f"{margin:.2f}"
        why = (
            f"router: simulator {'reliable' if reliable else 'unreliable'} ({evidence}; {c.router_accuracy} needed), "
            f"decider {'unsure' if unsure else 'confident'} (margin {shown}; {c.confident_margin} confident)"
        )
        if simulate:
            return Route(horizon, why + ": simulating", "simulate", verb, accuracy)
        return Route(0, why + ": acting reactively", "react", verb, accuracy)

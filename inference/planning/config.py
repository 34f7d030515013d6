"""Settings of the planning loop: a dozen top-level fields and one section per part of the loop.

    config = PlannerConfig(arm="simplan", k=4, judge=JudgeWeights(error=-3.0))   # None fields: the arm's preset
    config = PlannerConfig.from_dict({"arm": "plan", "judge": {"error": -3}})      # as recipes write it

    simplan run --arm simplan --k 4 --judge.error -3 --budgets.max_steps 40
    simplan eval ... --planner '{horizon: 2, judge: {error: -3}}'  or  --planner.judge.error -3

Sections (each a dataclass with its own defaults, help and checks, kept beside the code that reads it):
    budgets      what an episode may spend (router.py BudgetConfig)
    router       which decisions are simulated (router.py RouterConfig)
    grading      who grades a request before its episode, and each grade's route (grading.py GradingConfig)
    sampling     how the decider proposes and how long completions may be
    prompts      prompt layout; None reads it from the adapters (prompt_settings.json)
    imagination  what imagined states offer, the prediction cache, widening when every candidate loses
    judge        the judge's weights and threshold (judge.py JudgeWeights)
    pivot_rules  the pivot rules' thresholds (pivots.py PivotConfig)
    patterns     extra regexes added to the env's failure and progress patterns

`__post_init__` fills the arm preset (inference/planning/arms.py) and rejects bad values naming the field.
Configs written before the sections existed (flat keys such as `w_error`, `max_steps`, `router_rule`) are read
through LEGACY_KEYS (core/config.py `upgrade_keys`): old recipes, run folders and traces keep working.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from simplan.core.config import from_mapping
from simplan.data.episode import FORMATS, PromptSettings
from simplan.data.format import DEFAULT_MAX_FAILURES, DEFAULT_MAX_HISTORY
from simplan.envs.failures import compile_patterns
from simplan.inference.planning.arms import ARMS, arm_preset
from simplan.inference.planning.grading import GradingConfig
from simplan.inference.planning.judge import JudgeWeights
from simplan.inference.planning.pivots import PivotConfig
from simplan.inference.planning.router import BudgetConfig, RouterConfig, gives_horizon

DEFAULT_BUDGET = PromptSettings().budget
PROPOSE_MODES = ("auto", "score", "sample")
IMAGINED_ACTIONS = ("seen", "free")
SIMULATORS = ("model", "env")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def _check(section: str, checks: list[tuple[str, bool, str]], obj: object) -> None:
    for name, ok, expected in checks:
        if not ok:
            raise ValueError(f"{section}.{name}: must be {expected}, got {getattr(obj, name)!r}")


@dataclass
class SamplingConfig:
    """How the decider proposes, and how long completions may be."""

    propose: str = field(
        default="auto",
        metadata=_help("how the decider proposes: score valid actions, sample n=K, or auto (score when listed)"),
    )
    temperature: float = field(default=0.8, metadata=_help("sampling temperature of proposals (sample mode)"))
    top_p: float = field(default=0.95, metadata=_help("nucleus sampling of proposals (sample mode)"))
    seed: int | None = field(default=0, metadata=_help("seed of proposal sampling (None: random)"))
    decider_max_tokens: int = field(default=48, metadata=_help("max new tokens of a decider completion"))
    simulator_max_tokens: int = field(default=128, metadata=_help("max new tokens of a simulator completion"))
    fallback_action: str = field(
        default="look", metadata=_help("action text when the decider gives nothing usable and no valid list exists")
    )
    check_arguments: bool = field(
        default=True,
        metadata=_help(
            "check a tool call's arguments against its tool's JSON schema before it runs: one that does not fit "
            "is a parse failure (resampled, never executed)"
        ),
    )
    constrain_arguments: bool = field(
        default=False,
        metadata=_help(
            "decode a tool call under its tool's JSON schema (the call's regex, envs/actions.py call_regex): "
            "argument names and value types that do not fit cannot be written; off: only the tool's name is "
            "constrained"
        ),
    )

    def __post_init__(self) -> None:
        _check(
            "sampling",
            [
                ("temperature", self.temperature >= 0.0, ">= 0"),
                ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
                ("decider_max_tokens", self.decider_max_tokens >= 1, ">= 1"),
                ("simulator_max_tokens", self.simulator_max_tokens >= 1, ">= 1"),
            ],
            self,
        )
        if self.propose not in PROPOSE_MODES:
            raise ValueError(f"sampling.propose: {self.propose!r} is not one of {', '.join(PROPOSE_MODES)}")


@dataclass
class PromptConfig:
    """The prompt layout (data/episode.py PromptSettings). None reads a setting from the adapters
    (prompt_settings.json, saved by `simplan train`); a value that contradicts an adapter's is an error."""

    format: str | None = field(
        default=None, metadata=_help("conversation or step; None: the adapters' (step for the base model)")
    )
    budget: int | None = field(
        default=None, metadata=_help(f"prompt tokens per window / prompt; None: the adapters' ({DEFAULT_BUDGET})")
    )
    max_history: int | None = field(
        default=None,
        metadata=_help(
            f"step format: history steps shown before the budget; None: the adapters' ({DEFAULT_MAX_HISTORY})"
        ),
    )
    max_failures: int | None = field(
        default=None,
        metadata=_help(f"failure-memory notes shown in prompts; None: the adapters' ({DEFAULT_MAX_FAILURES})"),
    )

    def __post_init__(self) -> None:
        _check(
            "prompts",
            [
                ("budget", self.budget is None or self.budget >= 64, ">= 64"),
                ("max_history", self.max_history is None or self.max_history >= 0, ">= 0"),
                ("max_failures", self.max_failures is None or self.max_failures >= 0, ">= 0"),
            ],
            self,
        )
        if self.format not in (None, *FORMATS):
            raise ValueError(f"prompts.format: {self.format!r} is not one of {', '.join(FORMATS)}")


@dataclass
class ImaginationConfig:
    """What imagined states offer, the prediction cache, and widening the search when every candidate loses."""

    actions: str = field(
        default="seen",
        metadata=_help("actions offered in imagined states: seen (valid actions seen so far, constrained) or free"),
    )
    cache: bool = field(default=True, metadata=_help("cache simulator predictions by (state, action)"))
    cache_history: int = field(default=2, metadata=_help("history steps that are part of a cached state's key"))
    draft_expectations: bool = field(
        default=True,
        metadata=_help(
            "when only the committed candidate's prediction is needed (horizon 1, a judge that reads none), generate "
            "it after the real step with the real observation as the decoding draft: the same greedy text, in one "
            "forward where the simulator foresaw the step (hf backend; others decode it all)"
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

    def __post_init__(self) -> None:
        _check(
            "imagination",
            [("cache_history", self.cache_history >= 0, ">= 0"), ("widen_lost", self.widen_lost >= 0, ">= 0")],
            self,
        )
        if self.actions not in IMAGINED_ACTIONS:
            raise ValueError(f"imagination.actions: {self.actions!r} is not one of {', '.join(IMAGINED_ACTIONS)}")


@dataclass
class PatternConfig:
    """Extra regexes, added to the env's own (envs/base.py EnvDefaults, envs/failures.py)."""

    error: list[str] = field(default_factory=list, metadata=_help("extra regexes of error observations"))
    progress: list[str] = field(default_factory=list, metadata=_help("extra regexes of progress observations"))
    transient: list[str] = field(
        default_factory=list, metadata=_help("extra regexes of transient failures, retried as they are")
    )
    replan: list[str] = field(
        default_factory=list, metadata=_help("extra regexes of failures that change the plan: replan, no ban")
    )

    def __post_init__(self) -> None:
        compile_patterns(self.error + self.progress + self.transient + self.replan)


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
    simulator: str | None = field(
        default=None,
        metadata=_help(
            "who predicts imagined observations: model (the simulator adapter) or env (an oracle replaying the "
            "real env, inference/planning/oracle.py); None: the arm preset's, else model"
        ),
    )
    subgoals: bool = field(
        default=True,
        metadata=_help(
            "check every action against the env's sub-goals before it runs (inference/planning/subgoals.py), in "
            "every arm: a call that contradicts the first unmet one is repaired or goes after the decider's other "
            "proposals, a queued one is a pivot; envs that declare no sub-goals are unaffected"
        ),
    )
    decider_adapter: str = field(default="decider", metadata=_help("engine adapter of the decider ('' = base)"))
    simulator_adapter: str = field(default="simulator", metadata=_help("engine adapter of the simulator ('' = base)"))
    raise_errors: bool = field(default=False, metadata=_help("re-raise exceptions (the end event is written first)"))
    budgets: BudgetConfig = field(default_factory=BudgetConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    grading: GradingConfig = field(default_factory=GradingConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    prompts: PromptConfig = field(default_factory=PromptConfig)
    imagination: ImaginationConfig = field(default_factory=ImaginationConfig)
    judge: JudgeWeights = field(default_factory=JudgeWeights)
    pivot_rules: PivotConfig = field(default_factory=PivotConfig)
    patterns: PatternConfig = field(default_factory=PatternConfig)

    # The flat keys of configs written before the sections existed, and where each lives now.
    LEGACY_KEYS: ClassVar[dict[str, str]] = {
        **{k: f"budgets.{k}" for k in ("max_steps", "max_replans", "on_replan_budget", "token_budget")},
        "max_episode_seconds": "budgets.max_episode_seconds",
        "family_budgets": "budgets.family",
        "router": "router.mode",
        "router_rule": "router.rule",
        "router_accuracy": "router.accuracy",
        "router_min_rows": "router.min_rows",
        "simulator_accuracy": "router.simulator_accuracy",
        "confident_margin": "router.confident_margin",
        **{k: f"sampling.{k}" for k in ("propose", "temperature", "top_p", "decider_max_tokens")},
        "simulator_max_tokens": "sampling.simulator_max_tokens",
        "fallback_action": "sampling.fallback_action",
        "sample_seed": "sampling.seed",
        "prompt_format": "prompts.format",
        "prompt_budget": "prompts.budget",
        "max_history": "prompts.max_history",
        "max_failures": "prompts.max_failures",
        "imagined_actions": "imagination.actions",
        "sim_cache": "imagination.cache",
        "cache_history": "imagination.cache_history",
        "widen_lost": "imagination.widen_lost",
        **{
            f"w_{k}": f"judge.{k}"
            for k in ("error", "progress", "repeat", "failed", "premature", "lost", "won", "length", "likelihood")
        },
        "w_confidence": "judge.confidence",
        "discount": "judge.discount",
        "judge_threshold": "judge.threshold",
        **{
            k: f"pivot_rules.{k}"
            for k in ("mismatch_threshold", "similarity", "repeat_limit", "no_progress_steps", "min_score_drop")
        },
        "budget_fraction": "pivot_rules.budget_fraction",
        "warning_threshold": "pivot_rules.warning_threshold",
        "max_transient_retries": "pivot_rules.max_transient_retries",
        **{f"{k}_patterns": f"patterns.{k}" for k in ("error", "progress", "transient", "replan")},
    }

    def __post_init__(self) -> None:
        for key, value in arm_preset(self.arm).items():  # validates the arm name
            owner, _, name = key.rpartition(".")
            target = getattr(self, owner) if owner else self
            if getattr(target, name) is None:
                setattr(target, name, value)
        if self.simulator is None:
            self.simulator = "model"
        if self.router.mode is None:
            self.router.mode = "always"
        _check("PlannerConfig", [("k", self.k >= 1, ">= 1"), ("horizon", self.horizon >= 0, ">= 0")], self)
        if self.simulator not in SIMULATORS:
            raise ValueError(f"PlannerConfig.simulator: {self.simulator!r} is not one of {', '.join(SIMULATORS)}")

    @classmethod
    def from_dict(cls, mapping: dict | None, source: str = "mapping") -> PlannerConfig:
        """A PlannerConfig from a mapping as recipes, `--planner` and traces write it (nested or legacy flat keys)."""
        return from_mapping(cls, mapping, source)

    def simulates(self) -> bool:
        """Whether any decision of any task may be simulated by this config alone (a family's budgets or a route
        written in `grading.routes` may give a horizon). A grader file's fitted routes are not read here: the
        planner asks `Grading.simulates()` for those."""
        routes = (self.grading.routes or {}).values() if self.grading.mode != "off" else ()
        overrides = [*self.budgets.family.values(), *routes]
        return self.horizon > 0 or gives_horizon(overrides)

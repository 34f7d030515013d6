"""What an observation says about the action that led to it: failed or not, and which class of failure.

    rules = FailureRules.for_env(env)                 # the env's patterns (envs/base.py EnvDefaults) or the defaults
    rules.failure_class("503 Service Unavailable", flagged=True)   # "transient"
    rules.is_error("You can't do that.")                            # True: reads like a rejected action

One rule for every reader: the planner (its judge, the error and transient pivots), dataset building (which
failures the failure memory of a training prompt leaves out), and evaluation metrics (transient failures that
got through). An observation is a failure when the env flagged it (`Observation.error`) or when it reads like
one (the env's `error_patterns`, else DEFAULT_ERROR_PATTERNS). A failure is
  transient  it matches the env's `transient_patterns` (a 503, a timeout): the same call may work if repeated;
  replan     it matches `replan_patterns` (sold out): the world changed under the plan;
  permanent  anything else.
Patterns are regular expressions matched case-insensitively anywhere in the text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from simplan.envs.base import env_extra

# Phrases environments use to reject an action. Envs replace them with their own `error_patterns`;
# planner configs add more (PlannerConfig.patterns.error).
DEFAULT_ERROR_PATTERNS: tuple[str, ...] = (
    r"\byou can'?t\b",
    r"\byou cannot\b",
    r"\bcan not\b",
    r"\bnot (a )?valid\b",
    r"\binvalid\b",
    r"\bunknown (command|action|verb|tool|function)\b",
    r"\bi (don'?t|do not) understand\b",
    r"\bno such\b",
    r"\bnot found\b",
    r"\berror\b",
    r"\bfailed\b",
    r"\bnothing happens\b",
    r"\bthat'?s not something\b",
    r"\byou need\b",
)
# Phrases that signal progress or reward (a predicted observation that contains one is promising).
DEFAULT_PROGRESS_PATTERNS: tuple[str, ...] = (
    r"\byou (take|pick up|open|unlock|put|place|win|won|complete|completed)\b",
    r"\bscore\b",
    r"\bcongratulations\b",
    r"\bwell done\b",
    r"\bsuccess(fully)?\b",
    r"\btask (is )?(complete|done)\b",
    r"\bis now (open|on|active)\b",
)


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p, re.IGNORECASE))
        except re.error as e:
            raise ValueError(f"pattern {p!r} is not a valid regular expression ({e}); fix error_patterns") from None
    return out


def env_patterns(env: Any, attr: str, defaults: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """The env's own patterns (`error_patterns`, `progress_patterns`, ...: envs/base.py EnvDefaults) or the
    defaults, plus extras. `env`: an adapter instance or class."""
    own = env_extra(env, attr)
    return list(own if own else defaults) + list(extra)


def matches(text: str | None, patterns: Sequence[re.Pattern[str]]) -> bool:
    return any(p.search(text or "") for p in patterns)


def looks_like_error(text: str | None, patterns: Sequence[re.Pattern[str]] | None = None) -> bool:
    """True when an observation reads like a rejected or failed action (any pattern matches)."""
    return matches(text, _DEFAULT_ERROR_RE if patterns is None else patterns)


def mentions_progress(text: str | None, patterns: Sequence[re.Pattern[str]] | None = None) -> bool:
    return matches(text, _DEFAULT_PROGRESS_RE if patterns is None else patterns)


_DEFAULT_ERROR_RE = compile_patterns(DEFAULT_ERROR_PATTERNS)
_DEFAULT_PROGRESS_RE = compile_patterns(DEFAULT_PROGRESS_PATTERNS)


@dataclass(frozen=True)
class FailureRules:
    """Compiled failure patterns of one env (module docstring)."""

    error: tuple[re.Pattern[str], ...] = tuple(_DEFAULT_ERROR_RE)
    transient: tuple[re.Pattern[str], ...] = ()
    replan: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def for_env(
        cls, env: Any, error: Sequence[str] = (), transient: Sequence[str] = (), replan: Sequence[str] = ()
    ) -> FailureRules:
        """The rules of an adapter (instance or class; None: the defaults), plus extra patterns of each kind."""
        return cls(
            tuple(compile_patterns(env_patterns(env, "error_patterns", DEFAULT_ERROR_PATTERNS, error))),
            tuple(compile_patterns(env_patterns(env, "transient_patterns", (), transient))),
            tuple(compile_patterns(env_patterns(env, "replan_patterns", (), replan))),
        )

    def is_error(self, text: str | None) -> bool:
        return matches(text, self.error)

    def failed(self, text: str | None, flagged: bool = False) -> bool:
        """Whether an observation says its action failed: flagged by the env, or reading like an error."""
        return flagged or self.is_error(text)

    def failure_class(self, text: str | None, flagged: bool = False) -> str | None:
        """transient / replan / permanent (envs/base.py FAILURE_CLASSES), None when the action did not fail."""
        if not self.failed(text, flagged):
            return None
        if matches(text, self.transient):
            return "transient"
        if matches(text, self.replan):
            return "replan"
        return "permanent"

    def is_transient(self, text: str | None, flagged: bool = False) -> bool:
        return self.failure_class(text, flagged) == "transient"


@functools.cache
def rules_of_env(env: str) -> FailureRules:
    """The FailureRules of an env by its registry name or class spec, read from its adapter class without building
    it (no JVM). An env this process cannot resolve gets the defaults (no transient or replan patterns) with a
    warning that says what to do."""
    import warnings

    from simplan.envs.registry import UnknownEnvError, resolve

    try:
        factory = resolve(env)
    except UnknownEnvError as e:
        warnings.warn(
            f"env {env!r}: its transient failures cannot be told apart ({e}); every failure counts as permanent. "
            "Name the env's adapter class when building (`simplan build --env package.module:Class`; trajectories "
            "and traces record the env's own name, which only an installed package resolves), or install its "
            "package; for imported transcripts, name the env they came from (`simplan import --env NAME`) or ignore "
            "this if it has none.",
            stacklevel=2,
        )
        return FailureRules()
    return FailureRules.for_env(factory)

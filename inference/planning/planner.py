"""The planning loop: imagine, judge, commit, act and watch, pivot, finish (docs/architecture.md).

One loop, three arms (inference/planning/arms.py): `reactive` (K=1, H=0), `plan` (open-loop) and `simplan`
(simulate + pivot). The loop talks to the models only through the engine protocol
(inference/engines/base.py), renders every prompt with data/format.py, parses every model output with
the env's own `parse_action`, and writes a full trace (inference/planning/trace.py).

    planner = Planner(engine, env, PlannerConfig(arm="simplan"))
    result = planner.run(task)                 # EpisodeResult(trace, summary)

From the command line: `simplan run --env toy --task corridor-100 --arm simplan --engine hf ...`.

1. Imagine: from the real state the decider proposes K first actions (scores the valid actions
   with `engine.score` and keeps the top K when the env lists them, else samples n=K, constrained
   to the valid actions or to the tool-call syntax). Each candidate is rolled out H steps: the
   simulator predicts the next observation and the decider picks the next action. All K
   candidates of a depth go in ONE engine call per role. Predictions are cached by
   (state, action), each with the simulator's confidence (mean token logprob). The router
   (planner_config.Router) sets the depth: 0 when the decider is confident (adaptive), or with
   `router: selective` wherever the simulator is unreliable on the top candidate's verb and the
   decider is sure (inference/planning/sim_accuracy.py): the top action is then taken with no simulator call.
   With simulator "env" the env oracle answers, with its verdict (done, won, score); a simulator
   trained with verdicts (PromptSettings.verdicts) says "[episode over: won|lost]" on its reply's last
   line, split off into the same verdict. A rollout ends at a step that ends the episode.
2. Judge: inference/planning/judge.py scores each rollout with explicit parts; all are logged.
3. Commit: the best rollout's actions are queued with their expectations (predicted observations),
   cut before the first predicted error or a step predicted to lose (a verdict, from the env or the simulator).
4. Act and watch: queued actions run for real with no model calls while nothing fires. Before each
   queued action after a plan's first, when the env lists all valid actions, it must be among
   them (pivot `not_valid_now`): a plan made for an imagined state is not tried in a real state
   where it cannot apply.
5. Pivot: rules of inference/planning/pivots.py (after each real step) and `not_valid_now` (before one);
   a fired pivot drops the queue and replans from the real state (within the replan budget; once it
   is spent the loop goes on one decided action at a time, or stops with `on_replan_budget=stop`); one
   whose real action failed also writes a failure note into the prompt's failure memory and bans
   the action in that state. Failures have classes (the env's patterns, envs/base.py EnvDefaults): a
   transient one (a 503) fires `transient_error` and the same action runs again, with no model call,
   note, ban or replan, up to `max_transient_retries` times, then counts as permanent; a replan one
   (sold out) is noted and replanned but not banned; a permanent one is noted and banned.
6. Finish: only the env's `done`/`won` ends an episode as success or failure; budgets end it otherwise.
   A `finish` is judged like any action: one the env's verdict (`accepts()` for the real state, its
   `accept_patterns` on a predicted outcome) calls premature is penalised.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simplan.core.text import normalize, similarity
from simplan.data.episode import EpisodeState
from simplan.data.format import (
    Messages,
    PromptState,
    chat_token_counter,
    decider_messages,
    failure_note,
    simulator_messages,
    split_verdict,
    state_from_steps,
)
from simplan.envs.actions import render_action
from simplan.envs.base import (
    Action,
    ActionParseError,
    Env,
    Observation,
    StepResult,
    Task,
    action_key_of_text,
    env_extra,
    missing_from_complete_list,
)
from simplan.envs.failures import DEFAULT_PROGRESS_PATTERNS, FailureRules, env_patterns
from simplan.inference.engines.base import (
    Engine,
    GenerationRequest,
    GenerationResult,
    MeteredEngine,
    ScoreRequest,
)
from simplan.inference.engines.model_free import ModelFreeEngine
from simplan.inference.planning.config import PlannerConfig
from simplan.inference.planning.judge import Judge, JudgeMemory, Outcome, is_finish
from simplan.inference.planning.oracle import EnvOracle, OracleError, executed_actions, same_env_factory
from simplan.inference.planning.pivots import (
    PivotContext,
    PivotMonitor,
    PivotRule,
    StepRecord,
    TransientError,
    default_rules,
)
from simplan.inference.planning.prompt_fit import PromptFitter, approx_token_counter, locked
from simplan.inference.planning.prompts import PlannerPrompts
from simplan.inference.planning.router import Budgets, Router, load_simulator_accuracy
from simplan.inference.planning.sim_accuracy import action_verb
from simplan.inference.planning.trace import (
    ActEvent,
    CandidateRecord,
    CommitEvent,
    EndEvent,
    EpisodeSummary,
    EpisodeTrace,
    ImagineEvent,
    ParseFailureEvent,
    PivotEvent,
    PlanItem,
    ReplanEvent,
    TraceEvent,
    summarize,
)

# Pivot rules whose firing means the last action itself went wrong: its note goes to the failure
# memory, the judge down-weights it, and it is banned in the state where it failed.
FAILURE_RULES = ("error_observation", "repeated_action", "score_drop", "no_progress")
BAN_RULES = ("error_observation", "repeated_action")
NOT_VALID_NOW = "not_valid_now"  # checked before acting, not by the monitor: see Planner._not_valid_now


def _key(*parts: Any) -> str:
    # surrogatepass: a lone surrogate in any text (the engine boundary removes them from model text)
    # still hashes; every other text hashes to the same key as with a plain encode().
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _softmax(logprobs: list[float]) -> list[float]:
    """Probabilities of logprobs; uniform when all are -inf (nothing to prefer), [] for none."""
    if not logprobs:
        return []
    m = max(logprobs)
    if m == -math.inf:
        return [1.0 / len(logprobs)] * len(logprobs)
    exps = [math.exp(x - m) for x in logprobs]
    z = sum(exps)
    return [e / z for e in exps]


# ---------------------------------------------------------------------------------------------
# Episode state
# ---------------------------------------------------------------------------------------------
@dataclass
class Proposal:
    action: Action
    probability: float | None = None
    logprob: float | None = None


@dataclass
class Rollout:
    actions: list[Action]
    predicted: list[str | None] = field(default_factory=list)
    probability: float | None = None
    logprob: float | None = None
    alive: bool = True
    confidence: list[float | None] = field(default_factory=list)  # simulator's mean token logprob per prediction
    # The env's verdict on each prediction: the env oracle's, or a learned simulator's verdict line when it was
    # trained with verdicts (PromptSettings.verdicts); empty for a simulator without them.
    outcomes: list[Outcome | None] = field(default_factory=list)


def _first_lost(r: Rollout) -> bool:
    """Whether the rollout's first imagined step was predicted to lose the episode."""
    return bool(r.outcomes) and r.outcomes[0] is not None and r.outcomes[0].lost


@dataclass
class Queued:
    action: Action
    expectation: str | None
    source: str  # plan | reactive | fallback
    verdict: str | None = None  # the ending predicted for this step (won | lost), traced on its act event


@dataclass
class EpisodeResult:
    trace: EpisodeTrace
    summary: EpisodeSummary


@dataclass
class _Episode:
    task: Task
    budgets: Budgets
    trace: EpisodeTrace
    meter: MeteredEngine
    obs: Observation
    goal: str
    past: list[tuple[Action, str, bool]] = field(default_factory=list)  # real (action, observation, error)
    records: list[StepRecord] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    bans: dict[str, set[str]] = field(default_factory=dict)  # real state key -> banned action keys
    seen_valid: list[str] = field(default_factory=list)  # valid actions seen so far, first-seen order
    state: EpisodeState | None = None  # the conversation so far (conversation format; data/episode.py)
    memory: JudgeMemory = field(default_factory=JudgeMemory)
    score: float = 0.0
    replans: int = 0
    pivots: int = 0
    parse_failures: int = 0
    since_replan: int = 0
    degraded: str = ""  # why the loop acts without simulation from now on ("" = it does not)
    calls_at_last_act: int = 0
    prompt_at_last_act: int = 0
    cached_at_last_act: int = 0
    completion_at_last_act: int = 0
    tokens_at_last_act: int = 0
    planning_seconds: float = 0.0
    env_seconds: float = 0.0
    sample_calls: int = 0

    @property
    def steps(self) -> int:
        return len(self.past)


class Planner:
    """Runs episodes of one env with one engine. One Planner per concurrent episode stream."""

    def __init__(
        self,
        engine: Engine,
        env: Env,
        config: PlannerConfig,
        count_tokens: Callable[[Messages], int] | None = None,
        tokenizer: Any = None,
        rules: list[PivotRule] | None = None,
        sink: Callable[[TraceEvent], None] | None = None,
        oracle: EnvOracle | None = None,
    ) -> None:
        model_free = isinstance(engine, ModelFreeEngine)
        if model_free:  # --engine expert/random decide from this env's episodes (inference/engines/model_free.py)
            engine, env = engine.bind(env)
        self.engine, self.env, self.config, self.sink = engine, env, config, sink
        self.decider = config.decider_adapter or None
        # simulator "env" makes no simulator calls: the engine need not hold a simulator adapter.
        self.simulator = (config.simulator_adapter or None) if config.simulator == "model" else None
        known = list(getattr(engine, "adapters", []) or [])
        # An arm that never simulates (reactive: horizon 0 everywhere) needs no simulator adapter.
        simulates = config.simulates()
        for role, name in (("decider", self.decider), ("simulator", self.simulator if simulates else None)):
            if name is not None and name not in known:
                raise ValueError(
                    f"PlannerConfig.{role}_adapter: the engine has no adapter {name!r} (it has: "
                    f"{', '.join(known) or 'none'}); pass --adapters {role}=DIR to the engine, or use the base "
                    f"model: --{role}_adapter '' (simplan run) or --planner '{{{role}_adapter: \"\"}}' (simplan eval)"
                    + ("; the model-free engines (expert, random) serve only the reactive arm" if model_free else "")
                )
        # Token counting: the engine's tokenizer (chat template) unless a counter or tokenizer is given.
        tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        if not (tokenizer is not None and callable(tokenizer) and hasattr(tokenizer, "apply_chat_template")):
            tokenizer = None
        if count_tokens is None:
            count_tokens = locked(chat_token_counter(tokenizer)) if tokenizer is not None else approx_token_counter
        self.count_tokens = count_tokens
        self.prompts = PlannerPrompts.for_engine(engine, config, tokenizer)
        self.fitter = PromptFitter(count_tokens, self.prompts.decider_settings.budget, tokenizer)
        failures = FailureRules.for_env(env, config.patterns.error, config.patterns.transient, config.patterns.replan)
        progress_patterns = env_patterns(env, "progress_patterns", DEFAULT_PROGRESS_PATTERNS, config.patterns.progress)
        self.judge = Judge(config.judge, failures, progress_patterns, env_patterns(env, "accept_patterns", ()))
        # Checked before the monitor's rules: a transient failure is retried, not a pivot (pivots.py).
        self.transient = TransientError(failures, config.pivot_rules.max_transient_retries)
        if rules is None:
            rules = default_rules(config.pivot_rules, error_patterns=failures.error)
        self.rules = rules
        # router selective reads the simulator's per-verb accuracy (its adapter's simulator_accuracy.json).
        adapter_dirs = dict(getattr(engine, "adapter_dirs", None) or {})  # set by make_engine (engines/__init__.py)
        self.router = Router(config, load_simulator_accuracy(config, adapter_dirs) if simulates else None)
        # (state key, action key) -> (predicted observation, the simulator's mean token logprob of it)
        self.cache: dict[tuple[str, str], tuple[str, float | None]] = {}
        self._can_score = True
        self._unsupported: set[str] = set()  # constrained-decoding kinds the backend refused
        # simulator "env": the real env, replayed on copies, answers imagination (inference/planning/oracle.py); one
        # copy per candidate, so each rollout goes on from its own copy instead of replaying from the reset.
        self.oracle: EnvOracle | None = None
        if config.simulator == "env":
            self.oracle = oracle or EnvOracle(same_env_factory(env), copies=config.k or 1)

    def close(self) -> None:
        """Close what the planner started itself: the env oracle's copies (the env and engine are the caller's)."""
        if self.oracle is not None:
            self.oracle.close()

    # -- episode ---------------------------------------------------------------------------------
    def run(self, task: Task, episode_id: str | None = None) -> EpisodeResult:
        """One episode of `task`; never raises for env/engine failures (status "errored") unless raise_errors."""
        cfg = self.config
        t0 = time.perf_counter()
        status, error, won = "failed", None, False
        try:
            obs = self.env.reset(task)
        except Exception as e:  # e.g. a crashed JVM: the episode is lost but recorded
            obs = Observation(text="")
            status, error = "errored", f"reset: {type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
            if cfg.raise_errors:
                raise
        env_seconds = time.perf_counter() - t0
        budgets = self.router.budgets(task)
        trace = EpisodeTrace.start(
            episode_id=episode_id or f"{task.env}/{task.task_id}/{cfg.arm}/0",
            env=task.env,
            task=task.to_dict(),
            arm=cfg.arm,
            config=dataclasses.asdict(cfg),
            budgets=dataclasses.asdict(budgets),
            goal=obs.goal,
            observation=obs.text,
            sink=self.sink,
        )
        trace.t0 = t0
        # The meter stamps the episode id on every request as its session: the engine may reuse its prefixes.
        meter = MeteredEngine(self.engine, session=trace.episode_id)
        ep = _Episode(task, budgets, trace, meter, obs, obs.goal, env_seconds=env_seconds)
        ep.state = EpisodeState.start(obs.goal, obs.text, obs.tools, obs.valid_actions)
        self._note_valid(ep, obs)
        if error is None:
            try:
                status, won = self._loop(ep)
            except Exception as e:  # an env or engine failure ends this episode, not the evaluation
                status, error = "errored", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
                if cfg.raise_errors:
                    self._end(ep, status, won, error, t0)
                    raise
        self._end(ep, status, won, error, t0)
        return EpisodeResult(trace, summarize(trace))

    def _end(self, ep: _Episode, status: str, won: bool, error: str | None, t0: float) -> None:
        m = ep.meter
        ep.trace.add(
            EndEvent(
                status=status,
                success=won,
                score=ep.score,
                steps=ep.steps,
                replans=ep.replans,
                pivots=ep.pivots,
                parse_failures=ep.parse_failures,
                model_calls=m.calls,
                prompt_tokens=m.prompt_tokens,
                cached_prompt_tokens=m.cached_tokens,
                completion_tokens=m.completion_tokens,
                wall_seconds=round(time.perf_counter() - t0, 6),
                planning_seconds=round(ep.planning_seconds, 6),
                env_seconds=round(ep.env_seconds, 6),
                engine_seconds=round(m.seconds, 6),
                error=error,
            ),
            step=ep.steps,
        )
        m.end_session()  # the engine frees what it kept for this episode (the hf prefix cache)

    def _loop(self, ep: _Episode) -> tuple[str, bool]:
        """Run until the env ends the episode or a budget does; returns (status, won)."""
        b = ep.budgets
        rules = self.config.pivot_rules
        monitor = PivotMonitor(list(self.rules), rules.warning_threshold) if self.config.pivots else None
        queue: deque[Queued] = deque()
        while True:
            if ep.steps >= b.max_steps:
                return "budget_steps", False
            if b.max_seconds and time.perf_counter() - ep.trace.t0 >= b.max_seconds:
                return "budget_time", False
            fresh = not queue
            if fresh:
                if b.token_budget and ep.meter.tokens >= b.token_budget:
                    return "budget_tokens", False
                t = time.perf_counter()
                queue.extend(self.imagine(ep))
                ep.planning_seconds += time.perf_counter() - t
            item = queue.popleft()
            if monitor is not None and not fresh and (event := self._not_valid_now(ep, item)):
                # Cheaper than failing for real: the env already says the plan went off course.
                ep.trace.add(event, step=ep.steps)
                queue.appendleft(item)  # dropped with the rest of the plan
                if stop := self._pivot(ep, [event], item, None, queue, monitor):
                    return stop, False
                continue
            before_key = self._real_state_key(ep.obs)
            result = self._act(ep, item)
            if result.done:
                return ("success" if result.won else "failed"), bool(result.won)
            if monitor is None:
                continue
            ctx = PivotContext(
                history=ep.records,
                expectation=item.expectation,
                since_replan=ep.since_replan,
                score_before=ep.records[-2].score if len(ep.records) > 1 else 0.0,
                max_steps=b.max_steps,
                tokens_used=ep.meter.tokens,
                tokens_before=ep.tokens_at_last_act,
                max_tokens=b.token_budget,
            )
            if (retry := self.transient.check(ctx)) is not None:
                retry.fired = True  # the same action again: no model call, failure note, ban or replan
                ep.pivots += 1
                ep.trace.add(retry, step=ep.steps)
                queue.appendleft(item)
                continue
            events = monitor.check(ctx)
            for e in events:
                ep.trace.add(e, step=ep.steps)
            fired = [e for e in events if e.fired]
            if not fired or ep.steps >= b.max_steps:
                continue  # (the step budget ends the episode at the top of the loop: no replan to spend)
            if stop := self._pivot(ep, fired, item, (result, before_key), queue, monitor):
                return stop, False

    def _pivot(
        self,
        ep: _Episode,
        fired: list[PivotEvent],
        item: Queued,
        acted: tuple[StepResult, str] | None,
        queue: deque[Queued],
        monitor: PivotMonitor,
    ) -> str | None:
        """Handle fired pivots: learn from the failed action, drop the queue, replan (or stop, or turn
        reactive once the replan budget is spent). `acted`: the step's result and the state key before
        it, None when the pivot fired before acting. Returns an end status, or None to go on."""
        b = ep.budgets
        ep.pivots += len(fired)
        names = [e.rule for e in fired]
        note, banned = None, []
        if acted is not None and any(n in FAILURE_RULES for n in names):
            note = self._remember_failure(ep, item.action)
            ep.memory.failed_actions.add(item.action.key())
        # A failure that changed the plan (sold out) says nothing against the action itself: no ban.
        changed_plan = acted is not None and self._failure_class(ep, acted[0].observation) == "replan"
        if acted is not None and any(n in BAN_RULES for n in names) and not changed_plan:
            # A failed action rarely changes the world, so the state after it is the same place
            # under another description: ban the action under both keys.
            result, before_key = acted
            keys = {before_key, self._real_state_key(ep.obs)} if result.observation.error else {before_key}
            for k in keys:
                ep.bans.setdefault(k, set()).add(item.action.key())
            banned = [render_action(item.action)]
        if "budget_nearly_exhausted" in names:
            ep.degraded = ep.degraded or "budget nearly exhausted"
        dropped = len(queue)
        queue.clear()
        monitor.reset()
        ep.since_replan = 0
        if ep.replans >= b.max_replans:
            if self.config.budgets.on_replan_budget == "stop":
                return "budget_replans"
            ep.degraded = "replan budget spent"  # from now on one action per decision: nothing to replan
            return None
        ep.replans += 1
        ep.trace.add(
            ReplanEvent(
                reason=",".join(names),
                replans=ep.replans,
                budget=b.max_replans,
                dropped=dropped,
                banned=banned,
                failure_note=note,
            ),
            step=ep.steps,
        )
        return None

    def _not_valid_now(self, ep: _Episode, item: Queued) -> PivotEvent | None:
        """Pivot `not_valid_now` (error): a queued action is missing from the real state's valid actions.

        Checked before acting on every queued action after a plan's first, when the env lists every
        valid action (`Observation.valid_actions_complete`): the imagined state the action was planned
        in is evidently not the real one."""
        if not missing_from_complete_list(self.env, ep.obs, item.action):
            return None
        valid = ep.obs.valid_actions or []
        text = render_action(item.action)
        return PivotEvent(
            rule=NOT_VALID_NOW,
            severity="error",
            evidence={"action": text, "valid_actions": len(valid)},
            message=f"{text!r} is not among the {len(valid)} valid actions of the real state",
            fired=True,
        )

    def _act(self, ep: _Episode, item: Queued) -> StepResult:
        t = time.perf_counter()
        result = self.env.step(item.action)
        env_dt = time.perf_counter() - t
        ep.env_seconds += env_dt
        obs = result.observation
        match = None
        if item.expectation is not None:
            match = round(similarity(item.expectation, obs.text, self.config.pivot_rules.similarity), 4)
        error = bool(obs.error)
        ep.past.append((item.action, obs.text, error))
        ep.records.append(StepRecord(item.action.key(), obs.text, float(result.score), error))
        ep.memory.seen_pairs.add((item.action.key(), normalize(obs.text)))
        ep.score = float(result.score)
        ep.since_replan += 1
        m = ep.meter
        fault = result.info.get("fault") if isinstance(result.info, dict) else None
        ep.trace.add(
            ActEvent(
                action=render_action(item.action),
                action_key=item.action.key(),
                observation=obs.text,
                expectation=item.expectation,
                expected_verdict=item.verdict,
                match=match,
                error=error,
                reward=float(result.reward),
                score=float(result.score),
                done=bool(result.done),
                won=bool(result.won),
                source=item.source,
                fault=str(fault) if fault is not None else None,
                model_calls=m.calls - ep.calls_at_last_act,
                prompt_tokens=m.prompt_tokens - ep.prompt_at_last_act,
                cached_prompt_tokens=m.cached_tokens - ep.cached_at_last_act,
                completion_tokens=m.completion_tokens - ep.completion_at_last_act,
                env_seconds=round(env_dt, 6),
            ),
            step=ep.steps,
        )
        ep.tokens_at_last_act = m.tokens
        ep.calls_at_last_act, ep.prompt_at_last_act, ep.completion_at_last_act = (
            m.calls,
            m.prompt_tokens,
            m.completion_tokens,
        )
        ep.cached_at_last_act = m.cached_tokens
        # The goal changes as collection records it (data/recorder.py): when it differs from the first one.
        changed_goal = obs.goal if obs.goal and obs.goal != ep.state.turns[0].goal else None
        cls = self._failure_class(ep, obs) if error else None  # the failure memory leaves transient ones out
        ep.state.step(
            render_action(item.action),
            obs.text,
            error,
            obs.valid_actions,
            goal=changed_goal,
            tools=obs.tools,
            failure=cls,
        )
        ep.obs = obs
        if obs.goal:  # a BFCL user turn, what a TWX agent read: as in the training data
            ep.goal = obs.goal
        self._note_valid(ep, obs)
        if cls is not None:
            ep.memory.failure_classes[item.action.key()] = cls
        # Every arm remembers failed steps, as the training prompts do (data/format.py); a transient failure
        # is one to retry, not to avoid, until its retries are spent.
        if cls is not None and cls != "transient":
            self._remember_failure(ep, item.action)
        return result

    def _failure_class(self, ep: _Episode, obs: Observation) -> str | None:
        """The class of the last real step's failure (judge.failure_class), None when it did not fail; a
        transient failure whose retries are spent is permanent."""
        cls = self.judge.failure_class(obs.text, obs.error)
        if cls == "transient" and self.transient.attempts(ep.records) > self.transient.max_retries:
            return "permanent"
        return cls

    def _remember_failure(self, ep: _Episode, action: Action) -> str:
        """Add the failure note of `action` and the current observation: distinct, latest last, newest N kept."""
        note = failure_note(action, ep.obs.text)
        if note in ep.failures:
            ep.failures.remove(note)
        ep.failures.append(note)
        keep = self.prompts.decider_settings.max_failures
        ep.failures[:] = ep.failures[-keep:] if keep else []
        return note

    # -- states ----------------------------------------------------------------------------------
    def _note_valid(self, ep: _Episode, obs: Observation) -> None:
        for a in obs.valid_actions or []:
            if a not in ep.seen_valid:
                ep.seen_valid.append(a)

    @staticmethod
    def _real_state_key(obs: Observation) -> str:
        return _key(normalize(obs.text), list(obs.valid_actions or []))

    def _allowed(self, ep: _Episode) -> list[str] | None:
        """The real state's valid actions minus those banned here (all of them if everything is banned)."""
        valid = ep.obs.valid_actions
        if not valid:
            return None
        banned = ep.bans.get(self._real_state_key(ep.obs), set())
        allowed = [a for a in valid if action_key_of_text(self.env, a) not in banned]
        return allowed or list(valid)

    def _prompt_state(
        self,
        ep: _Episode,
        imagined: list[tuple[Action, str, bool]],
        observation: str,
        valid: list[str] | None,
        action: Action | None = None,
    ) -> PromptState | EpisodeState:
        """The state a prompt is rendered from: in the conversation format the episode state plus the
        imagined steps (shown exactly as real ones; windows fit the budget); in the step format a
        PromptState fitted to the token budget (of the simulator prompt when `action` is given)."""
        if self.prompts.conversation:
            state = ep.state.branch() if imagined else ep.state
            for a, o, e in imagined:
                state.step(render_action(a), o, error=e, imagined=True)
            return state
        state = state_from_steps(
            ep.goal,
            observation,
            ep.past + imagined,
            valid_actions=valid,
            tools=ep.obs.tools,
            failures=ep.failures,
            max_history=self.prompts.decider_settings.max_history,
        )
        render = decider_messages if action is None else (lambda s: simulator_messages(s, action))
        return self.fitter.fit(state, render)

    def _cache_key(self, state: PromptState | EpisodeState, action: Action) -> tuple[str, str]:
        if isinstance(state, EpisodeState):
            now, n = state.current, self.config.imagination.cache_history
            hist = state.turns[-1 - n : -1] if n else []
            return _key(
                now.goal,
                normalize(now.observation),
                [(t.action, normalize(t.next_observation or ""), t.error) for t in hist],
                now.valid_actions,
            ), action.key()
        n = self.config.imagination.cache_history
        hist = state.history[-n:] if n else []
        skey = _key(
            state.goal,
            normalize(state.observation),
            [(h.action, normalize(h.observation), h.error) for h in hist],
            state.valid_actions,
        )
        return skey, action.key()

    def _parse_failure(self, ep: _Episode, role: str, text: str, reason: str, handled: str) -> None:
        ep.parse_failures += 1
        ep.trace.add(ParseFailureEvent(role=role, text=text, reason=reason, handled=handled), step=ep.steps)

    def _parse(self, text: str, allowed: list[str] | None) -> Action:
        """Model text -> Action, or ActionParseError: an env parser that chokes on odd text (any ValueError,
        TypeError, RecursionError, MemoryError) counts as a parse failure, never as an episode crash."""
        try:
            action = self.env.parse_action(text)
        except ActionParseError:
            raise
        except (ValueError, TypeError, RecursionError, MemoryError) as e:
            raise ActionParseError(f"the env's parser failed: {type(e).__name__}: {str(e)[:200]}") from None
        if allowed is not None and action.key() not in {action_key_of_text(self.env, a) for a in allowed}:
            raise ActionParseError(f"{render_action(action)!r} is not among the valid actions")
        return action

    def _constraint(self, ep: _Episode, choices: list[str] | None) -> dict[str, Any]:
        """Constrained decoding for the decider: a choice list, or the tool-call syntax with the task's tools.

        A kind the backend refused once (NotImplementedError) is not asked for again; outputs are
        still parsed and checked against the valid actions, so only efficiency is lost.
        """
        if choices and "choices" not in self._unsupported:
            return {"choices": list(choices)}
        if ep.obs.tools and not choices and "regex" not in self._unsupported:
            names = [str(t.get("name") or t.get("function", {}).get("name", "")) for t in ep.obs.tools]
            names = [re.escape(n) for n in names if n] + ["finish"]
            return {"regex": rf"({'|'.join(names)})\(.*\)"}
        return {}

    def _generate(self, ep: _Episode, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One batched call; a backend that cannot constrain gets the requests again unconstrained."""
        try:
            return ep.meter.generate(requests)
        except NotImplementedError:
            kinds = {k for r in requests for k in ("choices", "regex", "json_schema") if getattr(r, k) is not None}
            if not kinds:
                raise
            self._unsupported |= kinds
            plain = [dataclasses.replace(r, choices=None, regex=None, json_schema=None) for r in requests]
            return ep.meter.generate(plain)

    # -- 1. imagine, 2. judge, 3. commit ---------------------------------------------------------
    def imagine(self, ep: _Episode) -> list[Queued]:
        """Propose, roll out, judge and commit from the real state; returns the plan queue."""
        b = ep.budgets
        t0 = time.perf_counter()
        calls0, p0, c0 = ep.meter.calls, ep.meter.prompt_tokens, ep.meter.completion_tokens
        cached0, cand0 = ep.meter.cached_tokens, ep.meter.candidate_tokens
        allowed = self._allowed(ep)
        root = self._prompt_state(ep, [], ep.obs.text, allowed)
        ranked, margin, how, fallback = self._propose(ep, root, allowed)
        proposals, spare = ranked[: b.k], ranked[b.k :]
        decision_prompt, decision_cached = ep.meter.prompt_tokens - p0, ep.meter.cached_tokens - cached0
        decision_candidates = ep.meter.candidate_tokens - cand0
        steps_left = b.max_steps - ep.steps
        verb = action_verb(render_action(proposals[0].action)) if proposals else ""
        route = self.router.route(b, margin, steps_left, ep.degraded, verb)
        horizon, reason = route.horizon, route.reason
        if fallback:
            horizon, reason = 0, "fallback: the decider gave no usable action"
        rollouts = [Rollout([p.action], [], p.probability, p.logprob) for p in proposals]
        hits = self._rollout(ep, rollouts, horizon, allowed)
        for _ in range(self.config.imagination.widen_lost if horizon > 0 else 0):
            if not spare or not all(_first_lost(r) for r in rollouts):
                break
            # Every candidate loses: the decider's next-best valid actions may not (a perfect simulator lost
            # TWX episodes on an arithmetic answer all three top guesses got wrong).
            more = [Rollout([p.action], [], p.probability, p.logprob) for p in spare[: b.k]]
            spare = spare[b.k :]
            hits += self._rollout(ep, more, horizon, allowed)
            rollouts += more
            how += f"; every candidate predicted lost: imagined {len(more)} more"
        verdict = self._accepts() if any(is_finish(r.actions[0].key()) for r in rollouts) else None
        records = []
        for i, r in enumerate(rollouts):
            keys = [a.key() for a in r.actions]
            parts, total = self.judge.score(
                keys,
                r.predicted,
                ep.memory,
                r.probability,
                finish_verdict=verdict,
                confidence=r.confidence,
                outcomes=r.outcomes,
            )
            records.append(
                CandidateRecord(
                    index=i,
                    actions=[render_action(a) for a in r.actions],
                    predicted=[p if p is not None else "" for p in r.predicted],
                    logprob=r.logprob,
                    confidence=[None if c is None else round(c, 6) for c in r.confidence],
                    outcomes=[None if o is None else o.label() for o in r.outcomes] or None,
                    parts=parts,
                    total=total,
                )
            )
        best = max(range(len(records)), key=lambda i: (records[i].total, -i))
        records[best].chosen = True
        m = ep.meter
        ep.trace.add(
            ImagineEvent(
                candidates=records,
                horizon=horizon,
                skipped_simulation=b.horizon > 0 and horizon == 0,
                reason="; ".join(x for x in (how, reason) if x),
                model_calls=m.calls - calls0,
                prompt_tokens=m.prompt_tokens - p0,
                cached_prompt_tokens=m.cached_tokens - cached0,
                decision_prompt_tokens=decision_prompt,
                decision_cached_prompt_tokens=decision_cached,
                candidate_tokens=m.candidate_tokens - cand0,
                decision_candidate_tokens=decision_candidates,
                completion_tokens=m.completion_tokens - c0,
                cache_hits=hits,
                simulator=self.config.simulator or "model",
                seconds=round(time.perf_counter() - t0, 6),
                margin=None if margin is None else round(margin, 6),
                route=route.route if not fallback else "",
                route_verb=route.verb,
                route_accuracy=route.accuracy,
            ),
            step=ep.steps,
        )
        source = "fallback" if fallback else ("plan" if horizon > 0 else "reactive")
        queue = self._commit(rollouts[best], records[best].total, source)
        ep.trace.add(
            CommitEvent(
                plan=[PlanItem(render_action(q.action), q.expectation) for q in queue],
                candidate=best,
                total=records[best].total,
            ),
            step=ep.steps,
        )
        return queue

    def _accepts(self) -> bool | None:
        """The env's verdict on the real state (its optional `accepts()`: is the goal met?), None without one."""
        accepts = env_extra(self.env, "accepts")
        return bool(accepts()) if callable(accepts) else None

    def _commit(self, rollout: Rollout, total: float, source: str) -> list[Queued]:
        queue = []
        for i, action in enumerate(rollout.actions):
            expectation = rollout.predicted[i] if i < len(rollout.predicted) else None
            outcome = rollout.outcomes[i] if i < len(rollout.outcomes) else None
            if i > 0 and (expectation is None or self.judge.is_error(expectation) or (outcome and outcome.lost)):
                break  # never queue an action expected to fail or lose, nor one whose outcome was not imagined
            queue.append(Queued(action, expectation, source, None if outcome is None else outcome.verdict))
            if self.judge.is_error(expectation or "") or total < self.config.judge.threshold:
                break  # a failing or low-scored plan: take one step and look again
        return queue

    def _propose(
        self, ep: _Episode, root: PromptState | EpisodeState, allowed: list[str] | None
    ) -> tuple[list[Proposal], float | None, str, bool]:
        """First actions from the real state, best first: (proposals, confidence margin, how, is_fallback).
        Scored valid actions are all returned (the caller imagines the first K, and the next ones when all of
        those lose); sampled ones are at most K."""
        mode = self.config.sampling.propose
        if mode == "auto":
            mode = "score" if allowed else "sample"
        if mode == "score" and allowed and self._can_score:
            scored = self._score_actions(ep, root, allowed)
            if scored is not None:
                probs = [p.probability or 0.0 for p in scored] + [0.0]
                margin = probs[0] - probs[1]
                return scored, margin, f"scored {len(allowed)} valid actions", False
        return self._sample(ep, root, allowed, ep.budgets.k)

    def _score_actions(
        self, ep: _Episode, root: PromptState | EpisodeState, allowed: list[str]
    ) -> list[Proposal] | None:
        req = ScoreRequest(
            candidates=list(allowed), adapter=self.decider, messages=self.prompts.decider(root), tag="decide"
        )
        try:
            (res,) = ep.meter.score([req])
        except NotImplementedError:
            self._can_score = False
            return None
        probs = _softmax(res.logprobs)
        out = []
        for text, lp, p in zip(allowed, res.logprobs, probs):
            try:
                action = self.env.parse_action(text)
            except ActionParseError as e:
                self._parse_failure(ep, "decider", text, f"valid action the env cannot parse: {e}", "dropped")
                continue
            out.append(Proposal(action, p, lp))
        out.sort(key=lambda p: -(p.probability or 0.0))
        return out or None

    def _sample(
        self, ep: _Episode, root: PromptState | EpisodeState, allowed: list[str] | None, k: int
    ) -> tuple[list[Proposal], float | None, str, bool]:
        cfg = self.config
        messages = self.prompts.decider(root)
        for attempt in range(2):  # sample, then resample once
            seed = None if cfg.sampling.seed is None else cfg.sampling.seed + ep.sample_calls
            ep.sample_calls += 1
            req = GenerationRequest(
                adapter=self.decider,
                messages=messages,
                n=k,
                # K=1 decides greedily; a resample after unparseable output samples instead.
                temperature=cfg.sampling.temperature if (k > 1 or attempt > 0) else 0.0,
                top_p=cfg.sampling.top_p,
                max_tokens=cfg.sampling.decider_max_tokens,
                logprobs=True,
                seed=seed,
                tag="decide",
                **self._constraint(ep, allowed),
            )
            (res,) = self._generate(ep, [req])
            counts: dict[str, int] = {}
            first: dict[str, Proposal] = {}
            failures = []
            for c in res.completions:
                try:
                    action = self._parse(c.text, allowed)
                except ActionParseError as e:
                    failures.append((c.text, str(e)))
                    continue
                key = action.key()
                counts[key] = counts.get(key, 0) + 1
                first.setdefault(key, Proposal(action, None, c.logprob))
            handled = "dropped" if first else ("resample" if attempt == 0 else "fallback")
            for text, why in failures:
                self._parse_failure(ep, "decider", text, why, handled)
            if first:
                n = sum(counts.values())
                ranked = sorted(first, key=lambda key: -counts[key])  # stable: first sampled wins ties
                props = [dataclasses.replace(first[key], probability=counts[key] / n) for key in ranked]
                # Agreement between samples is a confidence signal only when there are several samples.
                probs = [p.probability or 0.0 for p in props] + [0.0]
                margin = probs[0] - probs[1] if n > 1 else None
                return props, margin, f"sampled n={k}", False
        return [self._fallback(ep, root, allowed)], None, "fallback", True

    def _fallback(self, ep: _Episode, root: PromptState | EpisodeState, allowed: list[str] | None) -> Proposal:
        """The highest-scored valid action, else the first valid one, else the configured no-op, else finish."""
        if allowed:
            if self._can_score:
                scored = self._score_actions(ep, root, allowed)
                if scored:
                    return scored[0]
            for text in allowed:
                try:
                    return Proposal(self.env.parse_action(text))
                except ActionParseError:
                    continue
        try:
            return Proposal(self.env.parse_action(self.config.sampling.fallback_action))
        except ActionParseError:
            return Proposal(Action(kind="finish"))

    def _rollout(self, ep: _Episode, rollouts: list[Rollout], horizon: int, allowed: list[str] | None) -> int:
        """Imagine `horizon` steps of every rollout, one engine call per role and depth; returns cache hits."""
        cfg, b = self.config, ep.budgets
        hits = 0
        if cfg.imagination.actions == "seen" and ep.seen_valid:
            imagined_valid = list(dict.fromkeys((allowed or []) + ep.seen_valid))
        else:
            imagined_valid = None
        for depth in range(horizon):
            if b.token_budget and ep.meter.tokens >= b.token_budget:
                break
            alive = [r for r in rollouts if r.alive and len(r.actions) == depth + 1]
            if not alive:
                break
            # Simulate: the observation after each rollout's latest action.
            if self.oracle is not None:
                hits += self._env_predictions(ep, alive)
            pending: list[tuple[Rollout, tuple[str, str]]] = []
            requests = []
            for r in alive:
                if self.oracle is not None:
                    continue  # predicted by the env above: no model call
                state = self._imagined_state(ep, r, allowed if depth == 0 else imagined_valid)
                ckey = self._cache_key(state, r.actions[-1])
                if cfg.imagination.cache and ckey in self.cache:
                    text, confidence = self.cache[ckey]
                    self._add_prediction(r, text, confidence)
                    hits += 1
                    continue
                pending.append((r, ckey))
                requests.append(
                    GenerationRequest(
                        adapter=self.simulator,
                        messages=self.prompts.simulator(state, r.actions[-1]),
                        max_tokens=cfg.sampling.simulator_max_tokens,
                        logprobs=True,  # the prediction's confidence (mean token logprob), weighed by the judge
                        tag="simulate",
                    )
                )
            if requests:
                for (r, ckey), res in zip(pending, self._generate(ep, requests)):
                    text = res.completions[0].text.strip() if res.completions else ""
                    confidence = res.completions[0].mean_logprob if res.completions else None
                    if not text:
                        self._parse_failure(ep, "simulator", text, "empty prediction", "dropped")
                        self._add_prediction(r, None, None)
                        r.alive = False
                        continue
                    self._add_prediction(r, text, confidence)
                    if cfg.imagination.cache:
                        self.cache[ckey] = (text, confidence)
            for r in alive:
                if r.predicted[-1] is not None and self.judge.is_error(r.predicted[-1]):
                    r.alive = False  # the rollout ends at a predicted failure
            if depth == horizon - 1:
                break
            # Decide: the next action of every rollout still alive.
            alive = [r for r in alive if r.alive]
            if not alive or (b.token_budget and ep.meter.tokens >= b.token_budget):
                break
            requests = []
            for r in alive:
                state = self._imagined_state(ep, r, imagined_valid, predicted=True)
                requests.append(
                    GenerationRequest(
                        adapter=self.decider,
                        messages=self.prompts.decider(state),
                        max_tokens=cfg.sampling.decider_max_tokens,
                        tag="decide",
                        **self._constraint(ep, imagined_valid),
                    )
                )
            for r, res in zip(alive, self._generate(ep, requests)):
                text = res.completions[0].text if res.completions else ""
                try:
                    r.actions.append(self._parse(text, imagined_valid))
                except ActionParseError as e:
                    self._parse_failure(ep, "decider", text, str(e), "dropped")
                    r.alive = False
        return hits

    def _add_prediction(self, r: Rollout, text: str | None, confidence: float | None) -> None:
        """Append a learned simulator's prediction to `r`. A simulator trained with verdicts (its
        PromptSettings.verdicts) ends the reply to a step that ends the episode with a verdict line: it is split
        off (the text is what expectations and pivots compare with real observations, which carry none) and
        becomes the step's Outcome, ending the rollout there as the env oracle's verdict does. An adapter
        without the setting gives no outcomes, and its text is kept as it is."""
        verdict = None
        if text is not None and self.prompts.simulator_settings.verdicts:
            text, verdict = split_verdict(text)
        r.predicted.append(text)
        r.confidence.append(confidence)
        if self.prompts.simulator_settings.verdicts:
            r.outcomes.append(None if verdict is None else Outcome(done=True, won=verdict == "won"))
        if verdict is not None:
            r.alive = False  # nothing after the end of the episode is real

    def _env_predictions(self, ep: _Episode, alive: list[Rollout]) -> int:
        """Predict each rollout's latest observation with the env oracle (simulator "env"); returns cache hits.

        The replayed real prefix skips actions an injected fault kept from running (evaluation/faults.py). A
        replay that fails or runs past the oracle's time limit ends its rollout, like an empty prediction."""
        assert self.oracle is not None
        faults = [e.fault for e in ep.trace.of_type("act")]
        real = executed_actions([a for a, _, _ in ep.past], faults)
        hits = 0
        for r in alive:
            before = self.oracle.stats.hits
            try:
                result = self.oracle.predict_step(ep.task, real, r.actions)
            except OracleError as e:
                self._parse_failure(ep, "simulator", "", str(e), "dropped")
                r.predicted.append(None)
                r.confidence.append(None)
                r.outcomes.append(None)
                r.alive = False
                continue
            hits += self.oracle.stats.hits - before
            r.predicted.append(result.observation.text)
            r.confidence.append(None)  # the env's own answer: no model confidence to weigh
            r.outcomes.append(Outcome.of(result))  # the judge weighs an imagined win or loss
            if result.done:
                r.alive = False  # the episode ended here: any later step would only be "the episode is over"
        return hits

    def _imagined_state(
        self, ep: _Episode, r: Rollout, valid: list[str] | None, predicted: bool = False
    ) -> PromptState | EpisodeState:
        """The prompt state inside a rollout: real history + imagined steps so far.

        predicted=False: the state before the rollout's latest action (to simulate it);
        predicted=True: the state after the latest prediction (to decide the next action).
        """
        n = len(r.predicted) if predicted else len(r.actions) - 1
        imagined = [(r.actions[i], r.predicted[i] or "", False) for i in range(n)]
        observation = imagined[-1][1] if imagined else ep.obs.text
        return self._prompt_state(ep, imagined, observation, valid, action=None if predicted else r.actions[-1])

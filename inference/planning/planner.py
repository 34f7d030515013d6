"""The planning loop: act and watch, pivot, finish; imagination (imagination.py) proposes what to do.

One loop, several arms (inference/planning/arms.py): `reactive` (K=1, H=0), `plan` (open-loop), `simplan`
(simulate + pivot) and their variants. The loop talks to the models only through the engine protocol
(inference/engines/base.py), renders every prompt with data/episode.py and data/format.py, parses every model
output with the env's own `parse_action`, and writes a full trace (inference/planning/trace.py).

    planner = Planner(engine, env, PlannerConfig(arm="simplan"))
    result = planner.run(task)                 # EpisodeResult(trace, summary)

From the command line: `simplan run --env toy --task corridor-100 --arm simplan --engine hf ...`.

The loop, from the real state, until the env ends the episode or a budget does:
1. Imagine (imagination.py) when the queue of planned actions is empty: propose, roll out, judge and commit
   a plan, each action with its expectation (the predicted observation; one the choice did not read is decoded
   when its real step is known, with the real observation as the engine's draft: imagination.draft_expectations;
   with `pivot_rules.similarity: likelihood` the decision's first step is scored instead: the simulator's
   per-token probability of its real observation, which the act event's `match` records).
2. Act and watch: queued actions run for real with no model calls while nothing fires. Before each queued
   action after a plan's first, when the env lists all valid actions, it must be among them (pivot
   `not_valid_now`): a plan made for an imagined state is not tried in a real state where it cannot apply.
3. Pivot: the rules of pivots.py after each real step and `not_valid_now` before one; a fired pivot drops the
   queue and replans from the real state (within the replan budget; once it is spent the loop goes on one
   decided action at a time, or stops with `budgets.on_replan_budget: stop`); one whose real action failed
   also writes a failure note into the prompt's failure memory and bans the action in that state. Failures
   have classes (envs/failures.py): a transient one (a 503) fires `transient_error` and the same action runs
   again, with no model call, note, ban or replan, up to `pivot_rules.max_transient_retries` times, then
   counts as permanent; a replan one (sold out) is noted and replanned but not banned; a permanent one is
   noted and banned.
   With `subgoals` on and an env that declares them (envs/subgoals.py), a queued action that contradicts the
   first unmet sub-goal is the pivot `subgoal_violation` before it runs (a decision's proposals are screened
   against it in imagination.py), and each real step's facts update the belief they are checked on.
   With `pivot_rules.backtrack` naming a fired rule and an env that knows the inverse of the step just taken
   (EnvDefaults.inverse: TWX's move back, close what was opened, take back what was put), the replan first plays
   the inverse: back in the state before the step (its valid actions and score), the undone step is banned there
   and the decision is made again from that state (a backtrack event says whether the inverse restored it).
   Every pivot leaves a note in the episode state (data/format.py pivot_note: the rules, what was expected, a ban),
   and every arm notes a failed step as collection records it; a decider trained with notes
   (PromptSettings.notes) reads them in its next prompts, and the act events trace them either way.
4. Finish: only the env's `done`/`won` ends an episode as success or failure; budgets end it otherwise. A
   `finish` is judged like any action: one the env's verdict (`accepts()` for the real state, its
   `accept_patterns` on a predicted outcome) calls premature is penalised.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from simplan.core.errors import InputError
from simplan.core.text import normalize
from simplan.data.episode import EpisodeState
from simplan.data.format import (
    ERROR_RULE,
    Messages,
    chat_token_counter,
    failed_step_note,
    failure_note,
    pivot_note,
)
from simplan.data.outcomes import classify_outcome
from simplan.envs.actions import render_action
from simplan.envs.base import (
    Action,
    Env,
    Observation,
    StepResult,
    Task,
    action_key_of_text,
    env_extra,
    inverse_restores,
    missing_from_complete_list,
)
from simplan.envs.failures import DEFAULT_PROGRESS_PATTERNS, FailureRules, env_patterns
from simplan.envs.subgoals import Fact, describe_belief, env_facts
from simplan.inference.engines.base import (
    EmbedRequest,
    Engine,
    EnvBoundEngine,
    MeteredEngine,
    backend_name,
    can_embed,
)
from simplan.inference.planning.config import PlannerConfig
from simplan.inference.planning.episode_run import (
    Backtrack,
    EpisodeResult,
    EpisodeRun,
    Progress,
    Queued,
)
from simplan.inference.planning.grading import Grading, withhold
from simplan.inference.planning.imagination import Imagination
from simplan.inference.planning.judge import Judge
from simplan.inference.planning.oracle import EnvOracle
from simplan.inference.planning.pivots import (
    PivotContext,
    PivotMonitor,
    PivotRule,
    PredictedLoss,
    StepRecord,
    TransientError,
    default_rules,
    expectation_match,
)
from simplan.inference.planning.prompt_fit import PromptFitter, approx_token_counter, locked
from simplan.inference.planning.prompts import PlannerPrompts
from simplan.inference.planning.router import Router, load_simulator_accuracy
from simplan.inference.planning.subgoals import SubgoalTracker
from simplan.inference.planning.trace import (
    ActEvent,
    BacktrackEvent,
    EndEvent,
    EpisodeTrace,
    ParseFailureEvent,
    PivotEvent,
    ReplanEvent,
    TraceEvent,
    summarize,
)

# Pivot rules whose firing means the last action itself went wrong: its note goes to the failure
# memory and the judge down-weights it; those pivot_rules.ban_after names also ban it where it was taken.
FAILURE_RULES = (ERROR_RULE, "repeated_action", "score_drop", "no_progress")
NOT_VALID_NOW = "not_valid_now"  # checked before acting, not by the monitor: see Planner._not_valid_now
BACKTRACK = "backtrack"  # the source of a queued inverse (pivot_rules.backtrack)


# ---------------------------------------------------------------------------------------------
# Episode state


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
        model_free = isinstance(engine, EnvBoundEngine)  # the optional hook (inference/engines/base.py)
        if model_free:  # --engine expert/random decide from this env's episodes
            engine, env = engine.bind(env)
        self.engine, self.env, self.config, self.sink = engine, env, config, sink
        self.decider = config.decider_adapter or None
        # simulator "env" makes no simulator calls: the engine need not hold a simulator adapter.
        self.simulator = (config.simulator_adapter or None) if config.simulator == "model" else None
        known = list(getattr(engine, "adapters", []) or [])
        # An arm that never simulates (reactive: horizon 0 everywhere) needs no simulator adapter.
        self.grading = Grading.from_config(config.grading, env)  # None: requests are not graded
        simulates = config.simulates() or (self.grading is not None and self.grading.simulates())
        for role, name in (("decider", self.decider), ("simulator", self.simulator if simulates else None)):
            if name is not None and name not in known:
                raise InputError(
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
        self.embeds = config.pivot_rules.similarity == "embedding"  # the act's match uses it, pivots or not
        if self.embeds and not can_embed(engine):
            raise InputError(
                f"pivot_rules.similarity: embedding needs an engine that embeds texts (hf); {backend_name(engine)} "
                "does not: use token_f1 or ratio"
            )
        embedder = config.pivot_rules.embedding_adapter
        if self.embeds and embedder and embedder not in known:
            raise InputError(
                f"pivot_rules.embedding_adapter: the engine has no adapter {embedder!r} (it has: "
                f"{', '.join(known) or 'none'}); give one of them, or '' for the base model"
            )
        if config.pivot_rules.similarity == "likelihood" and simulates and config.simulator != "model":
            raise InputError(
                "pivot_rules.similarity: likelihood scores the real observation under a learned simulator; this "
                f"arm's simulator is {config.simulator!r} (the env itself predicts no probabilities): use token_f1 "
                "for this arm (arm_overrides), or simulator: model"
            )
        self.rules = rules
        # router selective reads the simulator's per-verb accuracy (its adapter's simulator_accuracy.json).
        adapter_dirs = dict(getattr(engine, "adapter_dirs", None) or {})  # set by make_engine (engines/__init__.py)
        self.router = Router(config, load_simulator_accuracy(config, adapter_dirs) if simulates else None)
        self.imagination = Imagination(self, oracle)  # propose, roll out, judge, commit (imagination.py)
        if config.pivot_rules.predicted_loss and self.imagination.outcome_judge is None:
            raise InputError(
                "pivot_rules.predicted_loss: the learned pivot needs a simulator trained with outcome lines "
                f"(simplan build --role simulator --outcomes true); this arm's simulator ({config.simulator}: "
                f"{'the env itself' if config.simulator == 'env' else 'an adapter without outcome lines'}) gives no "
                "outcome probabilities: train one, or turn the rule off for this arm (arm_overrides)"
            )

    def close(self) -> None:
        """Close what the planner started itself: the env oracle's copies (the env and engine are the caller's)."""
        self.imagination.close()

    # -- episode ---------------------------------------------------------------------------------
    def run(self, task: Task, episode_id: str | None = None) -> EpisodeResult:
        """One episode of `task`; never raises for env/engine failures (status "errored") unless raise_errors."""
        cfg = self.config
        t0 = time.perf_counter()
        status, error, won = "failed", None, False
        grade = None
        try:
            obs = self.env.reset(task)
            if self.grading is not None:  # before anything reads the observation: its tools are the route's
                grade = self.grading.grade(obs.goal, obs.text)
                obs = withhold(obs, grade.withheld)
        except Exception as e:  # e.g. a crashed JVM: the episode is lost but recorded
            obs = Observation(text="")
            status, error = "errored", f"reset: {type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
            if cfg.raise_errors:
                raise
        env_seconds = time.perf_counter() - t0
        budgets = self.router.budgets(task, grade.route if grade is not None else None)
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
        ep = EpisodeRun(task, budgets, trace, meter, obs, obs.goal, env_seconds=env_seconds)
        ep.ban_where = cfg.pivot_rules.ban_where
        if grade is not None:
            ep.withheld = frozenset(grade.withheld)
            trace.add(grade, step=0)
        facts = env_facts(self.env, None, obs.text, False) if error is None else []  # as collection records them
        ep.state = EpisodeState.start(obs.goal, obs.text, obs.tools, obs.valid_actions, facts=facts)
        ep.progress = Progress.start(obs.text)
        self._note_valid(ep, obs)
        if error is None and cfg.subgoals:
            ep.subgoals = SubgoalTracker.start(self.env, obs.goal)
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

    def _end(self, ep: EpisodeRun, status: str, won: bool, error: str | None, t0: float) -> None:
        m = ep.meter
        unmet = ep.subgoals.unmet_names() if ep.subgoals is not None else None
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
                unmet=unmet,
                reason=self._end_reason(ep, status, unmet or []),
                best_score=ep.progress.best_score,
                best_step=ep.progress.best_step,
                belief=describe_belief(ep.state.belief()) if callable(env_extra(self.env, "facts")) else None,
                asks=self._asks(ep),
            ),
            step=ep.steps,
        )
        m.end_session()  # the engine frees what it kept for this episode (the hf prefix cache)

    def _asks(self, ep: EpisodeRun) -> int | None:
        """The episode's real calls to the env's ask tool (None: the env declares none)."""
        tool = env_extra(self.env, "ask_tool")
        if not tool:
            return None
        return sum(a.kind == "tool_call" and a.name == tool for a, _, _ in ep.past)

    def _end_reason(self, ep: EpisodeRun, status: str, unmet: list[str]) -> str | None:
        """Why a budget ended the episode, in words, with the best it reached (None when no budget did)."""
        b, p = ep.budgets, ep.progress
        why = {
            "budget_steps": f"the step budget ({b.max_steps}) is spent",
            "budget_stall": f"{p.stalled(ep.steps)} steps without progress (no score above the best, "
            "no new observation, no sub-goal met)",
            "budget_tokens": f"the token budget ({b.token_budget:,}) is spent",
            "budget_time": f"the time budget ({b.max_seconds:g} s) is spent",
            "budget_replans": f"the replan budget ({b.max_replans}) is spent",
        }.get(status)
        if why is None:
            return None
        return f"{why}; best score {p.best_score:g} at step {p.best_step}" + (
            f"; unmet: {', '.join(unmet)}" if unmet else ""
        )

    def _loop(self, ep: EpisodeRun) -> tuple[str, bool]:
        """Run until the env ends the episode or a budget does; returns (status, won)."""
        b = ep.budgets
        rules = self.config.pivot_rules
        learned = self._learned_pivot()
        monitor = PivotMonitor([*self.rules, *learned], rules.warning_threshold) if self.config.pivots else None
        queue: deque[Queued] = deque()
        while True:
            if ep.steps >= b.max_steps:
                return "budget_steps", False
            if b.stall_steps and ep.progress.stalled(ep.steps) >= b.stall_steps:
                return "budget_stall", False
            if b.max_seconds and time.perf_counter() - ep.trace.t0 >= b.max_seconds:
                return "budget_time", False
            fresh = not queue
            if fresh:
                if b.token_budget and ep.meter.tokens >= b.token_budget:
                    return "budget_tokens", False
                t = time.perf_counter()
                queue.extend(self.imagination(ep))
                ep.planning_seconds += time.perf_counter() - t
            item = queue.popleft()
            if monitor is not None and not fresh:
                if (event := self._not_valid_now(ep, item) or self._violates(ep, item)) is not None:
                    # Cheaper than failing for real: the env (or its sub-goals) already says the plan went off course.
                    ep.trace.add(event, step=ep.steps)
                    queue.appendleft(item)  # dropped with the rest of the plan
                    if stop := self._pivot(ep, [event], item, None, queue, monitor):
                        return stop, False
                    continue
            before = ep.obs
            # The learned pivot's probabilities, from the state the step is taken in (cached where it was scored).
            step_probs = self.imagination.step_outcome(ep, item.action) if monitor and learned else None
            result = self._act(ep, item)
            if item.source == BACKTRACK:
                self._backtracked(ep, item, result)
            if result.done:
                return ("success" if result.won else "failed"), bool(result.won)
            if monitor is None:
                continue
            ctx = PivotContext(
                history=ep.records,
                expectation=item.expectation,
                expectation_cut=item.expectation_cut,
                since_replan=ep.since_replan,
                score_before=ep.score_before_last,
                max_steps=b.max_steps,
                tokens_used=ep.meter.tokens,
                tokens_before=ep.tokens_at_last_act,
                max_tokens=b.token_budget,
                embed=self._embedder(ep) if self.embeds else None,
                facts=self._facts(ep, item),
                outcome_probs=step_probs,
                likelihood=item.likelihood,
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
            if stop := self._pivot(ep, fired, item, (result, before), queue, monitor):
                return stop, False

    def _learned_pivot(self) -> list[PivotRule]:
        """The learned pivot (pivot_rules.predicted_loss) at the outcome judge's fitted threshold, or none."""
        judge = self.imagination.outcome_judge
        if not self.config.pivot_rules.predicted_loss or judge is None:
            return []
        return [PredictedLoss(threshold=judge.loss_pivot)]

    def _pivot(
        self,
        ep: EpisodeRun,
        fired: list[PivotEvent],
        item: Queued,
        acted: tuple[StepResult, Observation] | None,
        queue: deque[Queued],
        monitor: PivotMonitor,
    ) -> str | None:
        """Handle fired pivots: learn from the failed action, drop the queue, replan (or stop, or turn
        reactive once the replan budget is spent), backtracking first where pivot_rules.backtrack says so. `acted`:
        the step's result and the real observation before it, None when the pivot fired before acting. Returns an
        end status, or None to go on."""
        b = ep.budgets
        ep.pivots += len(fired)
        names = [e.rule for e in fired]
        note, banned = None, []
        if acted is not None and any(n in FAILURE_RULES for n in names):
            note = self._remember_failure(ep, item.action)
            ep.memory.failed_actions.add(item.action.key())
        # A failure that changed the plan (sold out) says nothing against the action itself: no ban.
        changed_plan = acted is not None and self._failure_class(ep, acted[0].observation) == "replan"
        if acted is not None and any(n in self.config.pivot_rules.ban_after for n in names) and not changed_plan:
            # A failed action rarely changes the world, so the state after it is the same place
            # under another description: ban the action under both keys.
            result, before = acted
            ep.ban(item.action, ep.place(before, upto=-1), *([ep.place(ep.obs)] if result.observation.error else []))
            banned = [render_action(item.action)]
        # The pivot's note for the next decision (the failed step's note is written by _act, in every arm).
        if others := [n for n in names if n != ERROR_RULE]:
            ep.state.note(
                pivot_note(
                    others,
                    render_action(item.action),
                    expected=item.expectation if acted is not None else None,
                    banned=bool(banned),
                )
            )
        if "budget_nearly_exhausted" in names:
            ep.degraded = ep.degraded or "budget nearly exhausted"
        dropped = len(queue)
        queue.clear()
        ep.backtrack = None  # an inverse still queued is dropped with the plan
        monitor.reset()
        ep.since_replan = 0
        if ep.replans >= b.max_replans:
            if self.config.budgets.on_replan_budget == "stop":
                return "budget_replans"
            ep.degraded = "replan budget spent"  # from now on one action per decision: nothing to replan
            return None
        ep.replans += 1
        undo = self._undo(ep, names, item, acted)
        ep.trace.add(
            ReplanEvent(
                reason=",".join(names),
                replans=ep.replans,
                budget=b.max_replans,
                dropped=dropped,
                banned=banned,
                failure_note=note,
                backtrack=render_action(undo.action) if undo is not None else None,
            ),
            step=ep.steps,
        )
        if undo is not None:
            queue.append(undo)
        return None

    def _undo(
        self, ep: EpisodeRun, names: list[str], item: Queued, acted: tuple[StepResult, Observation] | None
    ) -> Queued | None:
        """The inverse of the step just taken, queued to backtrack, when a fired rule is one of pivot_rules.backtrack,
        the step changed the state (it did not fail), is not itself an inverse, and the env knows its inverse."""
        rules = [n for n in names if n in self.config.pivot_rules.backtrack]
        inverse = env_extra(self.env, "inverse")
        if not rules or acted is None or inverse is None or item.source == BACKTRACK or acted[0].observation.error:
            return None
        back = inverse(item.action)
        if back is None:
            return None
        ep.backtrack = Backtrack(item.action, rules, acted[1], ep.score_before_last)
        return Queued(back, None, BACKTRACK)

    def _backtracked(self, ep: EpisodeRun, item: Queued, result: StepResult) -> None:
        """After an inverse ran: trace whether it restored the state before the undone step (its valid actions and
        score) and, where it did, ban the undone step there, so that the decision made again takes another."""
        undo, ep.backtrack = ep.backtrack, None
        if undo is None:
            return
        restored = not result.done and inverse_restores(undo.before, undo.score_before, result)
        banned = []
        if restored:
            # the same state, perhaps described otherwise (the belief before the undone step and its inverse)
            ep.ban(undo.undone, ep.place(undo.before, upto=-2), ep.place(ep.obs))
            banned = [render_action(undo.undone)]
        ep.trace.add(
            BacktrackEvent(
                undone=render_action(undo.undone),
                action=render_action(item.action),
                rules=undo.rules,
                restored=restored,
                score_before=undo.score_before,
                score=float(result.score),
                banned=banned,
            ),
            step=ep.steps,
        )

    def _embedder(self, ep: EpisodeRun) -> Callable[[list[str]], list[list[float]]]:
        """Texts -> embeddings through the episode's meter (counted as prompt tokens), for the mismatch rule; each
        text is embedded once per episode (the act's match and the rule read the same pair)."""
        adapter = self.config.pivot_rules.embedding_adapter or None

        def embed(texts: list[str]) -> list[list[float]]:
            new = [t for t in dict.fromkeys(texts) if t not in ep.embeddings]
            if new:
                results = ep.meter.embed([EmbedRequest(t, adapter=adapter, tag="embed") for t in new])
                ep.embeddings.update(zip(new, (r.vector for r in results)))
            return [ep.embeddings[t] for t in texts]

        return embed

    def _not_valid_now(self, ep: EpisodeRun, item: Queued) -> PivotEvent | None:
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

    def _facts(self, ep: EpisodeRun, item: Queued) -> tuple[list[Fact], list[Fact]] | None:
        """The env's facts of the step's expected and real observation, for the fact_mismatch rule (when it is on,
        the env declares facts and the step had an expectation); the real ones as `_act` put them in the state."""
        if not self.config.pivot_rules.fact_mismatch or item.expectation is None:
            return None
        return env_facts(self.env, item.action, item.expectation, False), ep.state.current.facts

    def _violates(self, ep: EpisodeRun, item: Queued) -> PivotEvent | None:
        """Pivot `subgoal_violation` (error): a queued action contradicts the first unmet sub-goal (subgoals.py).
        A decision's first action was screened already; the rest of its plan was chosen in imagined states."""
        return ep.subgoals.violation(item.action) if ep.subgoals is not None else None

    def _act(self, ep: EpisodeRun, item: Queued) -> StepResult:
        t = time.perf_counter()
        result = self.env.step(item.action)
        env_dt = time.perf_counter() - t
        ep.env_seconds += env_dt
        obs = result.observation = withhold(result.observation, ep.withheld)
        error = bool(obs.error)
        # (ep.score is still the score before this step)
        outcome = classify_outcome(error, obs.text, ep.score, result.score, result.done, result.won, self.judge.rules)
        m = ep.meter
        expected_tokens = None  # (prompt, cached) of an expectation generated now
        if item.pending is not None:  # its expectation or likelihood, left for now (module docstring)
            t, p0, c0 = time.perf_counter(), m.prompt_tokens, m.cached_tokens
            if self.imagination.scores_observations:
                item.likelihood = self.imagination.likelihood(ep, item.pending, obs.text, outcome)
            else:
                item.expectation, item.expectation_cut = self.imagination.expect(ep, item.pending, obs.text, outcome)
            item.pending = None
            ep.planning_seconds += time.perf_counter() - t
            expected_tokens = (m.prompt_tokens - p0, m.cached_tokens - c0)
        match = None
        if self.imagination.scores_observations:
            match = None if item.likelihood is None else round(item.likelihood, 4)
        elif item.expectation is not None:
            embed = self._embedder(ep) if self.embeds else None
            rules = self.config.pivot_rules
            sim, _ = expectation_match(
                item.expectation, obs.text, rules.similarity, item.expectation_cut, rules.cut_expectations, embed
            )
            match = round(sim, 4)
        ep.past.append((item.action, obs.text, error))
        ep.records.append(StepRecord(item.action.key(), obs.text, float(result.score), error))
        ep.memory.seen_pairs.add((item.action.key(), normalize(obs.text)))
        ep.score = float(result.score)
        ep.since_replan += 1
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
                notes=list(ep.state.current.notes),
                fault=str(fault) if fault is not None else None,
                model_calls=m.calls - ep.calls_at_last_act,
                prompt_tokens=m.prompt_tokens - ep.prompt_at_last_act,
                cached_prompt_tokens=m.cached_tokens - ep.cached_at_last_act,
                completion_tokens=m.completion_tokens - ep.completion_at_last_act,
                env_seconds=round(env_dt, 6),
                expectation_prompt_tokens=expected_tokens[0] if expected_tokens else None,
                expectation_cached_prompt_tokens=expected_tokens[1] if expected_tokens else None,
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
            outcome=outcome,  # what a simulator trained with outcome lines reads in its history, as in training
            facts=env_facts(self.env, item.action, obs.text, error),  # a later window's snapshot, as in training
        )
        ep.obs = obs
        change = ep.subgoals.observe(item.action, ep.state.current.facts) if ep.subgoals is not None else None
        if change is not None:
            ep.trace.add(change, step=ep.steps)
        ep.progress.step(ep.steps, result.score, obs.text, met_subgoal=change is not None)
        if obs.goal:  # a BFCL user turn, what a TWX agent read: as in the training data
            ep.goal = obs.goal
        self._note_valid(ep, obs)
        if cls is not None:
            ep.memory.failure_classes[item.action.key()] = cls
        # Every arm remembers failed steps, as the training prompts do (data/format.py); a transient failure
        # is one to retry, not to avoid, until its retries are spent.
        if cls is not None and cls != "transient":
            self._remember_failure(ep, item.action)
            ep.state.note(failed_step_note(render_action(item.action), cls))  # as collection records
        return result

    def _failure_class(self, ep: EpisodeRun, obs: Observation) -> str | None:
        """The class of the last real step's failure (judge.failure_class), None when it did not fail; a
        transient failure whose retries are spent is permanent."""
        cls = self.judge.failure_class(obs.text, obs.error)
        if cls == "transient" and self.transient.attempts(ep.records) > self.transient.max_retries:
            return "permanent"
        return cls

    def _remember_failure(self, ep: EpisodeRun, action: Action) -> str:
        """Add the failure note of `action` and the current observation: distinct, latest last, newest N kept."""
        note = failure_note(action, ep.obs.text)
        if note in ep.failures:
            ep.failures.remove(note)
        ep.failures.append(note)
        keep = self.prompts.decider_settings.max_failures
        ep.failures[:] = ep.failures[-keep:] if keep else []
        return note

    # -- states ----------------------------------------------------------------------------------
    def _note_valid(self, ep: EpisodeRun, obs: Observation) -> None:
        for a in obs.valid_actions or []:
            if a not in ep.seen_valid:
                ep.seen_valid.append(a)

    def _allowed(self, ep: EpisodeRun) -> list[str] | None:
        """The real state's valid actions minus those banned here (all of them if everything is banned)."""
        valid = ep.obs.valid_actions
        if not valid:
            return None
        banned = ep.bans.get(ep.place(ep.obs), set())
        allowed = [a for a in valid if action_key_of_text(self.env, a) not in banned]
        return allowed or list(valid)

    def _parse_failure(self, ep: EpisodeRun, role: str, text: str, reason: str, handled: str) -> None:
        ep.parse_failures += 1
        ep.trace.add(ParseFailureEvent(role=role, text=text, reason=reason, handled=handled), step=ep.steps)

    # -- 1. imagine, 2. judge, 3. commit ---------------------------------------------------------

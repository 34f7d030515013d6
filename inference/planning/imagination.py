"""Imagination: from the real state, propose first actions, roll them out, judge the rollouts, commit a plan.

    imagination = Imagination(planner)         # the planner builds it; it reads the planner's engine, env,
    queue = imagination(episode)               # config, prompts, judge and router, and keeps its own cache
                                               # of predictions and the env oracle's copies

One decision, as the planning loop (planner.py) calls it when its queue is empty:
1. Propose: the decider scores the valid actions when the env lists them (`engine.score`, all of them ranked)
   or samples n=K, constrained to the valid actions or to the tool-call syntax; with `subgoals` on, the env's
   sub-goals screen them (subgoals.py: a call that contradicts the first unmet one is repaired or goes last);
   the router (router.py) sets how deep to imagine (0: take the top action without a simulator call).
2. Roll out: each of the K candidates is rolled out H steps, the simulator predicting each observation and
   the decider choosing the next action; all K candidates of a depth go in ONE engine call per role, and
   predictions are cached by (state, action) with the simulator's confidence (mean token logprob). With
   simulator "env" the env oracle (oracle.py) answers with its verdict (done, won, score); a simulator
   trained with verdicts says "[episode over: won|lost]" on its reply's last line. When every candidate's
   first step is predicted to lose, the decider's next K ranked actions are imagined too (`widen_lost`).
   At horizon 1, when the judge reads no prediction (judge.py `reads_predictions`: its text parts at 0, a text
   simulator without verdicts), the candidates are judged first and only the committed one is imagined: the
   others' observations could not change the choice, and the committed one's is the expectation pivots check.
   That one is generated after the real step (`draft_expectations`), with the real observation as the engine's
   decoding draft: the same greedy text, in one forward where the simulator foresaw the step (`expect`). With
   the mismatch rule on `likelihood` no expected text is needed: the committed step's real observation is scored
   under the simulator from the state it was decided in, after the step (`likelihood`).
3. Judge: judge.py scores each rollout with explicit, logged parts.
4. Commit: the best rollout's actions are queued with their expectations, cut before the first predicted error
   or loss; the imagine and commit events go into the trace.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simplan.core.text import normalize
from simplan.data.episode import EpisodeState
from simplan.data.format import (
    PromptState,
    decider_messages,
    observation_completion,
    simulator_messages,
    split_outcome,
    split_verdict,
    state_from_steps,
)
from simplan.data.outcomes import OUTCOMES
from simplan.envs.actions import argument_problem, call_regex, render_action
from simplan.envs.base import Action, ActionParseError, action_key_of_text, env_extra
from simplan.envs.subgoals import env_facts
from simplan.inference.engines.base import GenerationRequest, GenerationResult, ScoreRequest
from simplan.inference.planning.episode_run import EpisodeRun, PendingExpectation, Queued, digest_key
from simplan.inference.planning.judge import Outcome, is_finish
from simplan.inference.planning.oracle import EnvOracle, OracleError, executed_actions, same_env_factory
from simplan.inference.planning.outcomes import OutcomeJudge, outcome_probabilities, outcome_request
from simplan.inference.planning.proposals import Proposal, Proposer
from simplan.inference.planning.sim_accuracy import action_verb
from simplan.inference.planning.trace import CandidateRecord, CommitEvent, ImagineEvent, PlanItem

if TYPE_CHECKING:
    from simplan.inference.planning.planner import Planner


# ---------------------------------------------------------------------------------------------


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
    cut: set[int] = field(default_factory=set)  # indices of the predictions the simulator's token limit cut
    pending: PendingExpectation | None = None  # the first prediction, left for after the real step


def _reply(res: GenerationResult) -> tuple[str, float | None, bool]:
    """A simulator call's reply: (its text, stripped; its mean token logprob; whether the token limit cut it)."""
    if not res.completions:
        return "", None, False
    c = res.completions[0]
    return c.text.strip(), c.mean_logprob, c.finish_reason == "length"


def _first_lost(r: Rollout) -> bool:
    """Whether the rollout's first imagined step was predicted to lose the episode."""
    return bool(r.outcomes) and r.outcomes[0] is not None and r.outcomes[0].lost


class Imagination:
    """The planner's imagination (module docstring). One per Planner; it keeps the planner's prediction cache,
    which constrained-decoding kinds the backend refused, and the env oracle's copies (simulator "env")."""

    def __init__(self, planner: Planner, oracle: EnvOracle | None = None) -> None:
        self.planner = planner
        self.propose = Proposer(self)  # the decider's first actions (proposals.py)
        # (state key, action key) -> (predicted observation, the simulator's mean token logprob of it, whether its
        # token limit cut it)
        self.cache: dict[tuple[str, str], tuple[str, float | None, bool]] = {}
        self.propose.can_score = True
        self._unsupported: set[str] = set()  # constrained-decoding kinds the backend refused
        # simulator "env": the real env, replayed on copies, answers imagination (oracle.py); one copy per
        # candidate, so each rollout goes on from its own copy instead of replaying from the reset.
        self.oracle: EnvOracle | None = None
        config = planner.config
        if config.simulator == "env":
            self.oracle = oracle or EnvOracle(same_env_factory(planner.env), copies=config.k or 1)
        # A simulator trained with outcome lines is asked for outcome probabilities, not rollouts (outcomes.py).
        self.outcome_judge: OutcomeJudge | None = None
        if config.simulator == "model" and planner.prompts.simulator_settings.outcomes:
            dirs = dict(getattr(planner.engine, "adapter_dirs", None) or {})
            self.outcome_judge = OutcomeJudge.for_adapter(dirs.get(config.simulator_adapter or ""))
        self.outcome_cache: dict[tuple[str, str], dict[str, float]] = {}

    def close(self) -> None:
        if self.oracle is not None:
            self.oracle.close()

    def __call__(self, ep: EpisodeRun) -> list[Queued]:
        """Propose, roll out, judge and commit from the real state; returns the plan queue."""
        b = ep.budgets
        t0 = time.perf_counter()
        calls0, p0, c0 = ep.meter.calls, ep.meter.prompt_tokens, ep.meter.completion_tokens
        cached0, cand0 = ep.meter.cached_tokens, ep.meter.candidate_tokens
        allowed = self.planner._allowed(ep)
        root = self._prompt_state(ep, [], ep.obs.text, allowed)
        ranked, margin, how, fallback = self.propose(ep, root, allowed)
        if ep.subgoals is not None and not fallback:  # the env's sub-goals screen the proposals (subgoals.py)
            complete = allowed if allowed and ep.obs.valid_actions_complete else None
            keys = {action_key_of_text(self.planner.env, a) for a in complete} if complete else None
            ranked, screened = ep.subgoals.screen(ranked, keys)
            if screened is not None:
                ep.trace.add(screened, step=ep.steps)
        proposals, spare = ranked[: b.k], ranked[b.k :]
        decision_prompt, decision_cached = ep.meter.prompt_tokens - p0, ep.meter.cached_tokens - cached0
        decision_candidates = ep.meter.candidate_tokens - cand0
        steps_left = b.max_steps - ep.steps
        verb = action_verb(render_action(proposals[0].action)) if proposals else ""
        route = self.planner.router.route(b, margin, steps_left, ep.degraded, verb)
        horizon, reason = route.horizon, route.reason
        if fallback:
            horizon, reason = 0, "fallback: the decider gave no usable action"
        if horizon > 0 and self.outcome_judge is not None:  # a simulator that predicts outcomes (outcomes.py)
            rollouts, records, best, hits, why = self._by_outcomes(ep, proposals, spare, allowed)
            how = f"{how}; {why}"
        else:
            rollouts, records, best, hits, how = self._by_rollouts(ep, proposals, spare, allowed, horizon, how)
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
                simulator=self.planner.config.simulator or "model",
                seconds=round(time.perf_counter() - t0, 6),
                margin=None if margin is None else round(margin, 6),
                route=route.route if not fallback else "",
                route_verb=route.verb,
                route_accuracy=route.accuracy,
            ),
            step=ep.steps,
        )
        source = "fallback" if fallback else ("plan" if horizon > 0 else "reactive")
        queue = self.commit(rollouts[best], records[best].total, source)
        ep.trace.add(
            CommitEvent(
                plan=[PlanItem(render_action(q.action), q.expectation) for q in queue],
                candidate=best,
                total=records[best].total,
                suboptimal=self.suboptimal(records[best]) if horizon > 0 else "",
            ),
            step=ep.steps,
        )
        return queue

    def suboptimal(self, chosen: CandidateRecord) -> str:
        """Why the chosen candidate of a simulated decision is the best of bad ones, '' when it is not: the judge
        scored every candidate below `judge.threshold` (the commit is cut to one step), or the outcome judge found
        every one over its veto (it took the least bad)."""
        if self.outcome_judge is not None:
            bad, veto = chosen.parts.get("bad", 0.0), self.outcome_judge.veto
            return f"every candidate over the veto {veto:.2f}: took the least bad ({bad:.2f})" if bad > veto else ""
        threshold = self.planner.config.judge.threshold
        if chosen.total >= threshold:
            return ""
        return f"every candidate scored below judge.threshold {threshold:g}: the best {chosen.total:.2f}"

    def _by_rollouts(
        self,
        ep: EpisodeRun,
        proposals: list[Proposal],
        spare: list[Proposal],
        allowed: list[str] | None,
        horizon: int,
        how: str,
    ) -> tuple[list[Rollout], list[CandidateRecord], int, int, str]:
        """Roll every candidate out `horizon` steps and judge the imagined texts (judge.py): (rollouts, their
        records, the best one's index, cache hits, how it was decided)."""
        b = ep.budgets
        rollouts = [Rollout([p.action], [], p.probability, p.logprob) for p in proposals]
        committed_only = horizon == 1 and not self._reads_predictions(rollouts)
        hits = self._rollout(ep, rollouts, horizon, allowed) if not committed_only else 0
        for _ in range(self.planner.config.imagination.widen_lost if horizon > 0 else 0):
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
        scores = [
            self.planner.judge.score(
                [a.key() for a in r.actions],
                r.predicted,
                ep.memory,
                r.probability,
                finish_verdict=verdict,
                confidence=r.confidence,
                outcomes=r.outcomes,
            )
            for r in rollouts
        ]
        best = max(range(len(scores)), key=lambda i: (scores[i][1], -i))
        if self.scores_observations and horizon > 0:  # the mismatch rule scores the real observation: no text
            self._pend(ep, rollouts[best], allowed)
            if committed_only:
                how += "; only the committed candidate's real observation scored, after its step: the judge reads none"
        elif committed_only:  # the choice is made: imagine the committed candidate's observation, its expectation
            if self.planner.config.imagination.draft_expectations and self._defer(ep, rollouts[best], allowed):
                how += "; only the committed candidate imagined, after its real step: the judge reads no prediction"
            else:
                hits += self._rollout(ep, [rollouts[best]], horizon, allowed)
                how += "; only the committed candidate imagined: the judge reads no prediction"
        records = [
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
            for i, (r, (parts, total)) in enumerate(zip(rollouts, scores))
        ]
        return rollouts, records, best, hits, how

    def _defer(self, ep: EpisodeRun, rollout: Rollout, allowed: list[str] | None) -> bool:
        """Leave the one-step rollout's prediction for after its real step (imagination.draft_expectations), unless
        the cache holds it; False when it does (nothing deferred: the prediction comes from the cache)."""
        pending = self._first_step_request(ep, rollout, allowed)
        if self.planner.config.imagination.cache and pending.key in self.cache:
            return False
        rollout.pending = pending
        return True

    @property
    def scores_observations(self) -> bool:
        """Whether the mismatch rule reads the simulator's likelihood of each simulated decision's real observation
        (pivot_rules.similarity `likelihood`, an arm with pivots) instead of an expected text."""
        cfg = self.planner.config
        return cfg.pivots and cfg.pivot_rules.similarity == "likelihood"

    def _first_step_request(self, ep: EpisodeRun, rollout: Rollout, allowed: list[str] | None) -> PendingExpectation:
        """The simulator's request for the rollout's first step from the real state, and its prediction-cache key."""
        first = Rollout([rollout.actions[0]])
        state = self._imagined_state(ep, first, allowed)
        return PendingExpectation(
            self._simulate_request(state, first.actions[0]), self._cache_key(state, first.actions[0])
        )

    def _pend(self, ep: EpisodeRun, rollout: Rollout, allowed: list[str] | None) -> None:
        """Keep the simulator's request for the rollout's first step, so its real observation can be scored once the
        step is taken (`likelihood`)."""
        rollout.pending = self._first_step_request(ep, rollout, allowed)

    def likelihood(self, ep: EpisodeRun, pending: PendingExpectation, observed: str, outcome: str) -> float | None:
        """The simulator's per-token probability of the real reply to the pending request (the observation, after
        the outcome class's line for a simulator trained with outcome lines, and the end of the reply): the
        geometric mean, teacher-forced in one scoring call; None where it scored no token."""
        completion = observation_completion(observed, outcome=outcome if self.outcome_judge is not None else None)
        r = pending.request
        request = ScoreRequest(
            candidates=[completion], adapter=r.adapter, messages=r.messages, prompt=r.prompt, tag="expect"
        )
        (res,) = ep.meter.score([request])
        n, logprob = res.num_tokens[0], res.logprobs[0]
        if n <= 0:
            return None
        return math.exp(logprob / n) if math.isfinite(logprob) else 0.0

    def expect(
        self, ep: EpisodeRun, pending: PendingExpectation, observed: str, outcome: str
    ) -> tuple[str | None, bool]:
        """A deferred prediction (`_defer`), generated now that the real step is known: its reply (the observation,
        after the outcome class's line for a simulator trained with outcome lines) is the engine's decoding draft
        (inference/engines/base.py "Drafts"), so the text is what greedy decoding gives without it, in one forward
        where the simulator foresaw the step. Returns (the expectation, whether the token limit cut it), cached as
        the predictions made before a step are."""
        draft = observation_completion(observed, outcome=outcome if self.outcome_judge is not None else None)
        text, _, cut = self._predict(ep, dataclasses.replace(pending.request, draft=draft), pending.key)
        return text, cut

    def _simulate_request(self, state: PromptState | EpisodeState, action: Action) -> GenerationRequest:
        """The simulator's request for the observation after `action` in `state`."""
        return GenerationRequest(
            adapter=self.planner.simulator,
            messages=self.planner.prompts.simulator(state, action),
            max_tokens=self.planner.config.sampling.simulator_max_tokens,
            logprobs=True,  # the prediction's confidence (mean token logprob), weighed by the judge
            tag="simulate",
        )

    def _reads_predictions(self, rollouts: list[Rollout]) -> bool:
        """Whether the judge's choice among one-step rollouts can depend on their predictions: the env oracle's and
        a verdict simulator's carry verdicts (won, lost, widening), and a text is read as judge.py
        `reads_predictions` says."""
        if self.oracle is not None or self.planner.prompts.simulator_settings.verdicts:
            return True
        return self.planner.judge.reads_predictions([r.actions[0].key() for r in rollouts])

    def _by_outcomes(
        self, ep: EpisodeRun, proposals: list[Proposal], spare: list[Proposal], allowed: list[str] | None
    ) -> tuple[list[Rollout], list[CandidateRecord], int, int, str]:
        """Score each candidate's outcome probabilities and let the outcome judge choose (outcomes.py); the
        chosen one's observation is generated as its expectation when pivots watch the plan."""
        judge, k = self.outcome_judge, ep.budgets.k
        assert judge is not None
        candidates = list(proposals)
        probs, hits = self._outcome_probs(ep, candidates, allowed)
        for _ in range(self.planner.config.imagination.widen_lost):
            if not spare or any(judge.bad(p) <= judge.veto for p in probs):
                break
            more, spare = spare[:k], spare[k:]  # every candidate is vetoed: the decider's next ranked ones
            more_probs, more_hits = self._outcome_probs(ep, more, allowed)
            candidates, probs, hits = candidates + more, probs + more_probs, hits + more_hits
        best, why = judge.choose([c.logprob for c in candidates], probs)
        rollouts = []
        for c, p in zip(candidates, probs):
            predicted = max(OUTCOMES, key=lambda o: p[o])
            verdict = Outcome(done=True, won=predicted == "won") if predicted in ("won", "lost") else None
            rollouts.append(Rollout([c.action], [], c.probability, c.logprob, outcomes=[verdict]))
        defer = self.planner.config.imagination.draft_expectations  # after the step: the choice does not read it
        if self.scores_observations:
            self._pend(ep, rollouts[best], allowed)
        elif self.planner.config.pivots and not (defer and self._defer(ep, rollouts[best], allowed)):
            text, confidence, cut, cached = self._expectation(ep, rollouts[best], allowed)
            rollouts[best].predicted.append(text)
            rollouts[best].confidence.append(confidence)
            if cut:
                rollouts[best].cut.add(0)
            hits += cached
        records = [
            CandidateRecord(
                index=i,
                actions=[render_action(r.actions[0])],
                predicted=[t or "" for t in r.predicted],
                logprob=r.logprob,
                confidence=[None if c is None else round(c, 6) for c in r.confidence],
                outcomes=[None if r.outcomes[0] is None else r.outcomes[0].label()],
                outcome_probs={o: round(v, 6) for o, v in p.items()},
                parts={"bad": round(judge.bad(p), 6)},
                total=round(judge.value(r.logprob, p), 6),
            )
            for i, (r, p) in enumerate(zip(rollouts, probs))
        ]
        return rollouts, records, best, hits, why

    def step_outcome(self, ep: EpisodeRun, action: Action) -> dict[str, float]:
        """The outcome probabilities of `action` from the real state, as the outcome judge reads them (cached where the
        decision scored it): what the learned pivot weighs once the step is taken (pivots.py `PredictedLoss`)."""
        probs, _ = self._outcome_probs(ep, [Proposal(action)], self.planner._allowed(ep))
        return probs[0]

    def _outcome_probs(
        self, ep: EpisodeRun, candidates: list[Proposal], allowed: list[str] | None
    ) -> tuple[list[dict[str, float]], int]:
        """Outcome probabilities of each candidate from the real state, in one engine call; (probs, cache hits)."""
        keys, requests, out = [], [], [None] * len(candidates)
        for i, c in enumerate(candidates):
            state = self._imagined_state(ep, Rollout([c.action]), allowed)
            key = self._cache_key(state, c.action)
            if key in self.outcome_cache:
                out[i] = self.outcome_cache[key]
                continue
            keys.append((i, key))
            requests.append(outcome_request(self.planner.prompts.simulator(state, c.action), self.planner.simulator))
        if requests:
            for (i, key), probs in zip(keys, outcome_probabilities(ep.meter.score(requests))):
                out[i] = self.outcome_cache[key] = probs
        return out, len(candidates) - len(requests)  # type: ignore[return-value]

    def _expectation(
        self, ep: EpisodeRun, rollout: Rollout, allowed: list[str] | None
    ) -> tuple[str | None, float | None, bool, int]:
        """The committed candidate's predicted observation (its outcome line split off), confidence, whether the
        token limit cut it, and 1 if cached."""
        state = self._imagined_state(ep, rollout, allowed)
        key = self._cache_key(state, rollout.actions[0])
        if self.planner.config.imagination.cache and key in self.cache:
            text, confidence, cut = self.cache[key]
            return text, confidence, cut, 1
        return (*self._predict(ep, self._simulate_request(state, rollout.actions[0]), key), 0)

    def _predict(
        self, ep: EpisodeRun, request: GenerationRequest, key: tuple[str, str]
    ) -> tuple[str | None, float | None, bool]:
        """The committed candidate's prediction: (its observation, with the outcome line of a simulator trained with
        them split off; the simulator's confidence; whether the token limit cut it), cached under `key`."""
        (res,) = self._generate(ep, [request])
        raw, confidence, cut = _reply(res)
        text = (split_outcome(raw)[0].strip() if self.outcome_judge is not None else raw) or None
        if text is None:
            self.planner._parse_failure(ep, "simulator", raw, "empty prediction", "dropped")
        elif self.planner.config.imagination.cache:
            self.cache[key] = (text, confidence, cut)
        return text, confidence, cut

    def _accepts(self) -> bool | None:
        """The env's verdict on the real state (its optional `accepts()`: is the goal met?), None without one."""
        accepts = env_extra(self.planner.env, "accepts")
        return bool(accepts()) if callable(accepts) else None

    def commit(self, rollout: Rollout, total: float, source: str) -> list[Queued]:
        queue = []
        for i, action in enumerate(rollout.actions):
            expectation = rollout.predicted[i] if i < len(rollout.predicted) else None
            outcome = rollout.outcomes[i] if i < len(rollout.outcomes) else None
            if i > 0 and (
                expectation is None or self.planner.judge.is_error(expectation) or (outcome and outcome.lost)
            ):
                break  # never queue an action expected to fail or lose, nor one whose outcome was not imagined
            verdict = None if outcome is None else outcome.verdict
            pending = rollout.pending if i == 0 else None
            queue.append(Queued(action, expectation, source, verdict, i in rollout.cut, pending))
            if self.planner.judge.is_error(expectation or "") or total < self.planner.config.judge.threshold:
                break  # a failing or low-scored plan: take one step and look again
        return queue

    def _rollout(self, ep: EpisodeRun, rollouts: list[Rollout], horizon: int, allowed: list[str] | None) -> int:
        """Imagine `horizon` steps of every rollout, one engine call per role and depth; returns cache hits."""
        cfg, b = self.planner.config, ep.budgets
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
                    text, confidence, cut = self.cache[ckey]
                    self._add_prediction(r, text, confidence, cut)
                    hits += 1
                    continue
                pending.append((r, ckey))
                requests.append(self._simulate_request(state, r.actions[-1]))
            if requests:
                for (r, ckey), res in zip(pending, self._generate(ep, requests)):
                    text, confidence, cut = _reply(res)
                    if not text:
                        self.planner._parse_failure(ep, "simulator", text, "empty prediction", "dropped")
                        self._add_prediction(r, None, None)
                        r.alive = False
                        continue
                    self._add_prediction(r, text, confidence, cut)
                    if cfg.imagination.cache:
                        self.cache[ckey] = (text, confidence, cut)
            for r in alive:
                if r.predicted[-1] is not None and self.planner.judge.is_error(r.predicted[-1]):
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
                        adapter=self.planner.decider,
                        messages=self.planner.prompts.decider(state),
                        max_tokens=cfg.sampling.decider_max_tokens,
                        tag="decide",
                        **self._constraint(ep, imagined_valid),
                    )
                )
            for r, res in zip(alive, self._generate(ep, requests)):
                text = res.completions[0].text if res.completions else ""
                try:
                    r.actions.append(self._parse(text, imagined_valid, ep.obs.tools, ep.withheld))
                except ActionParseError as e:
                    self.planner._parse_failure(ep, "decider", text, str(e), "dropped")
                    r.alive = False
        return hits

    def _add_prediction(self, r: Rollout, text: str | None, confidence: float | None, cut: bool = False) -> None:
        """Append a learned simulator's prediction to `r` (`cut`: its token limit ended it). A simulator trained
        with verdicts (its PromptSettings.verdicts) ends the reply to a step that ends the episode with a verdict
        line: it is split off (the text is what expectations and pivots compare with real observations, which
        carry none) and becomes the step's Outcome, ending the rollout there as the env oracle's verdict does. An
        adapter without the setting gives no outcomes, and its text is kept as it is."""
        verdict = None
        if text is not None and self.planner.prompts.simulator_settings.verdicts:
            text, verdict = split_verdict(text)
        if cut:
            r.cut.add(len(r.predicted))
        r.predicted.append(text)
        r.confidence.append(confidence)
        if self.planner.prompts.simulator_settings.verdicts:
            r.outcomes.append(None if verdict is None else Outcome(done=True, won=verdict == "won"))
        if verdict is not None:
            r.alive = False  # nothing after the end of the episode is real

    def _env_predictions(self, ep: EpisodeRun, alive: list[Rollout]) -> int:
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
                self.planner._parse_failure(ep, "simulator", "", str(e), "dropped")
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
        self, ep: EpisodeRun, r: Rollout, valid: list[str] | None, predicted: bool = False
    ) -> PromptState | EpisodeState:
        """The prompt state inside a rollout: real history + imagined steps so far.

        predicted=False: the state before the rollout's latest action (to simulate it);
        predicted=True: the state after the latest prediction (to decide the next action).
        """
        n = len(r.predicted) if predicted else len(r.actions) - 1
        imagined = [(r.actions[i], r.predicted[i] or "", False) for i in range(n)]
        observation = imagined[-1][1] if imagined else ep.obs.text
        return self._prompt_state(ep, imagined, observation, valid, action=None if predicted else r.actions[-1])

    def _prompt_state(
        self,
        ep: EpisodeRun,
        imagined: list[tuple[Action, str, bool]],
        observation: str,
        valid: list[str] | None,
        action: Action | None = None,
    ) -> PromptState | EpisodeState:
        """The state a prompt is rendered from: in the conversation format the episode state plus the
        imagined steps (shown exactly as real ones; windows fit the budget); in the step format a
        PromptState fitted to the token budget (of the simulator prompt when `action` is given)."""
        if self.planner.prompts.conversation:
            state = ep.state.branch() if imagined else ep.state
            for a, o, e in imagined:  # with their facts, as a real step's: a window's snapshot reads them the same
                state.step(render_action(a), o, error=e, imagined=True, facts=env_facts(self.planner.env, a, o, e))
            return state
        state = state_from_steps(
            ep.goal,
            observation,
            ep.past + imagined,
            valid_actions=valid,
            tools=ep.obs.tools,
            failures=ep.failures,
            max_history=self.planner.prompts.decider_settings.max_history,
        )
        render = decider_messages if action is None else (lambda s: simulator_messages(s, action))
        return self.planner.fitter.fit(state, render)

    def _cache_key(self, state: PromptState | EpisodeState, action: Action) -> tuple[str, str]:
        if isinstance(state, EpisodeState):
            now, n = state.current, self.planner.config.imagination.cache_history
            hist = state.turns[-1 - n : -1] if n else []
            return digest_key(
                now.goal,
                normalize(now.observation),
                [(t.action, normalize(t.next_observation or ""), t.error) for t in hist],
                now.valid_actions,
            ), action.key()
        n = self.planner.config.imagination.cache_history
        hist = state.history[-n:] if n else []
        skey = digest_key(
            state.goal,
            normalize(state.observation),
            [(h.action, normalize(h.observation), h.error) for h in hist],
            state.valid_actions,
        )
        return skey, action.key()

    def _parse(
        self,
        text: str,
        allowed: list[str] | None,
        tools: list[dict[str, Any]] | None = None,
        withheld: Collection[str] = (),
    ) -> Action:
        """Model text -> Action, or ActionParseError: an env parser that chokes on odd text (any ValueError,
        TypeError, RecursionError, MemoryError) counts as a parse failure, never as an episode crash. A tool call
        whose arguments do not fit its tool's JSON schema in `tools` is one too (sampling.check_arguments), and so
        is a call to a tool the request's grade withheld (`withheld`, inference/planning/grading.py): neither is
        ever executed."""
        try:
            action = self.planner.env.parse_action(text)
        except ActionParseError:
            raise
        except (ValueError, TypeError, RecursionError, MemoryError) as e:
            raise ActionParseError(f"the env's parser failed: {type(e).__name__}: {str(e)[:200]}") from None
        if action.kind == "tool_call" and action.name in withheld:
            raise ActionParseError(f"{action.name} is not among this episode's tools (its grade's route withholds it)")
        if allowed is not None and action.key() not in {action_key_of_text(self.planner.env, a) for a in allowed}:
            raise ActionParseError(f"{render_action(action)!r} is not among the valid actions")
        if tools and self.planner.config.sampling.check_arguments:
            problem = argument_problem(action, tools)
            if problem is not None:
                raise ActionParseError(f"arguments do not fit the tool's schema: {problem}")
        return action

    def _constraint(self, ep: EpisodeRun, choices: list[str] | None) -> dict[str, Any]:
        """Constrained decoding for the decider: a choice list, or the tool-call syntax with the task's tools (and
        their arguments' schemas with sampling.constrain_arguments).

        A kind the backend refused once (NotImplementedError) is not asked for again; outputs are
        still parsed and checked against the valid actions, so only efficiency is lost.
        """
        if choices and "choices" not in self._unsupported:
            return {"choices": list(choices)}
        if ep.obs.tools and not choices and "regex" not in self._unsupported:
            return {"regex": call_regex(ep.obs.tools, arguments=self.planner.config.sampling.constrain_arguments)}
        return {}

    def _generate(self, ep: EpisodeRun, requests: list[GenerationRequest]) -> list[GenerationResult]:
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

"""Proposals: the decider's first actions from the real state, best first, with their probabilities.

    propose = Proposer(imagination)
    ranked, margin, how, fallback = propose(episode, root_state, allowed_actions)

When the env lists the valid actions, the decider scores every one of them (`engine.score`) and all come back
ranked, with the top-1 minus top-2 probability as the decider's confidence margin; otherwise it samples n=K
(greedy for K=1), constrained to the tool-call syntax, and agreement between samples is the probability. A
decider that gives nothing usable falls back to the best scored valid action, the first valid one, the
configured no-op, or finish.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simplan.data.episode import EpisodeState
from simplan.data.format import PromptState
from simplan.envs.base import Action, ActionParseError
from simplan.inference.engines.base import GenerationRequest, ScoreRequest, softmax
from simplan.inference.planning.episode_run import EpisodeRun

if TYPE_CHECKING:
    from simplan.inference.planning.imagination import Imagination


@dataclass
class Proposal:
    action: Action
    probability: float | None = None
    logprob: float | None = None


class Proposer:
    """The decider's proposals for one Imagination (module docstring); `can_score` turns False for a backend
    that cannot score, which is then never asked again."""

    def __init__(self, imagination: Imagination) -> None:
        self.imagination = imagination
        self.can_score = True

    def __call__(
        self, ep: EpisodeRun, root: PromptState | EpisodeState, allowed: list[str] | None
    ) -> tuple[list[Proposal], float | None, str, bool]:
        """First actions from the real state, best first: (proposals, confidence margin, how, is_fallback).
        Scored valid actions are all returned (the caller imagines the first K, and the next ones when all of
        those lose); sampled ones are at most K."""
        mode = self.imagination.planner.config.sampling.propose
        if mode == "auto":
            mode = "score" if allowed else "sample"
        if mode == "score" and allowed and self.can_score:
            scored = self.score_actions(ep, root, allowed)
            if scored is not None:
                probs = [p.probability or 0.0 for p in scored] + [0.0]
                margin = probs[0] - probs[1]
                return scored, margin, f"scored {len(allowed)} valid actions", False
        return self.sample(ep, root, allowed, ep.budgets.k)

    def score_actions(
        self, ep: EpisodeRun, root: PromptState | EpisodeState, allowed: list[str]
    ) -> list[Proposal] | None:
        req = ScoreRequest(
            candidates=list(allowed),
            adapter=self.imagination.planner.decider,
            messages=self.imagination.planner.prompts.decider(root),
            tag="decide",
        )
        try:
            (res,) = ep.meter.score([req])
        except NotImplementedError:
            self.can_score = False
            return None
        probs = softmax(res.logprobs)
        out = []
        for text, lp, p in zip(allowed, res.logprobs, probs):
            try:
                action = self.imagination.planner.env.parse_action(text)
            except ActionParseError as e:
                self.imagination.planner._parse_failure(
                    ep, "decider", text, f"valid action the env cannot parse: {e}", "dropped"
                )
                continue
            out.append(Proposal(action, p, lp))
        out.sort(key=lambda p: -(p.probability or 0.0))
        return out or None

    def sample(
        self, ep: EpisodeRun, root: PromptState | EpisodeState, allowed: list[str] | None, k: int
    ) -> tuple[list[Proposal], float | None, str, bool]:
        cfg = self.imagination.planner.config
        messages = self.imagination.planner.prompts.decider(root)
        for attempt in range(2):  # sample, then resample once
            seed = None if cfg.sampling.seed is None else cfg.sampling.seed + ep.sample_calls
            ep.sample_calls += 1
            req = GenerationRequest(
                adapter=self.imagination.planner.decider,
                messages=messages,
                n=k,
                # K=1 decides greedily; a resample after unparseable output samples instead.
                temperature=cfg.sampling.temperature if (k > 1 or attempt > 0) else 0.0,
                top_p=cfg.sampling.top_p,
                max_tokens=cfg.sampling.decider_max_tokens,
                logprobs=True,
                seed=seed,
                tag="decide",
                **self.imagination._constraint(ep, allowed),
            )
            (res,) = self.imagination._generate(ep, [req])
            counts: dict[str, int] = {}
            first: dict[str, Proposal] = {}
            failures = []
            for c in res.completions:
                try:
                    action = self.imagination._parse(c.text, allowed, ep.obs.tools, ep.withheld)
                except ActionParseError as e:
                    failures.append((c.text, str(e)))
                    continue
                key = action.key()
                counts[key] = counts.get(key, 0) + 1
                first.setdefault(key, Proposal(action, None, c.logprob))
            handled = "dropped" if first else ("resample" if attempt == 0 else "fallback")
            for text, why in failures:
                self.imagination.planner._parse_failure(ep, "decider", text, why, handled)
            if first:
                n = sum(counts.values())
                ranked = sorted(first, key=lambda key: -counts[key])  # stable: first sampled wins ties
                props = [dataclasses.replace(first[key], probability=counts[key] / n) for key in ranked]
                # Agreement between samples is a confidence signal only when there are several samples.
                probs = [p.probability or 0.0 for p in props] + [0.0]
                margin = probs[0] - probs[1] if n > 1 else None
                return props, margin, f"sampled n={k}", False
        return [self.fallback(ep, root, allowed)], None, "fallback", True

    def fallback(self, ep: EpisodeRun, root: PromptState | EpisodeState, allowed: list[str] | None) -> Proposal:
        """The highest-scored valid action, else the first valid one, else the configured no-op, else finish."""
        if allowed:
            if self.can_score:
                scored = self.score_actions(ep, root, allowed)
                if scored:
                    return scored[0]
            for text in allowed:
                try:
                    return Proposal(self.imagination.planner.env.parse_action(text))
                except ActionParseError:
                    continue
        try:
            return Proposal(
                self.imagination.planner.env.parse_action(self.imagination.planner.config.sampling.fallback_action)
            )
        except ActionParseError:
            return Proposal(Action(kind="finish"))

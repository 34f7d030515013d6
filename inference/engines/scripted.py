"""Deterministic engines for tests, examples and loop benchmarks: outputs are functions of the prompt.

`ScriptedEngine` implements the engine protocol (inference/engines/base.py) with plain Python callables
that map a request (and the content of its last user message) to completions, records every
batched call, and can sleep to imitate a real model's latency. `ToyOracle` supplies such
callables for the toy env (envs/toy.py): a decider that plays the expert and a simulator that
predicts exactly, by replaying the actions a prompt shows on a fresh copy of the env.

    oracle = ToyOracle(task)
    engine = ScriptedEngine(decide=oracle.decide, simulate=oracle.simulate, score=oracle.score)
    Planner(engine, ToyEnv(), PlannerConfig(arm="simplan", max_history=50)).run(task)

The oracle needs the whole history in the prompt (set PlannerConfig.max_history high); it reads
prompts through the section headers of data/format.py.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from pathlib import Path

from simplan.data.episode import PromptSettings, write_settings
from simplan.data.format import ERROR_MARK, SECTION_ACTION, SECTION_HISTORY, SECTION_OBSERVATION
from simplan.envs.base import Action, Task
from simplan.envs.toy import ToyEnv
from simplan.inference.engines.base import (
    Completion,
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
    ScoreResult,
)

Responder = Callable[[GenerationRequest, str], "str | list[str]"]
Scorer = Callable[[ScoreRequest, str], list[float]]


def last_user_content(messages: list[dict[str, str]] | None, prompt: str | None = None) -> str:
    if messages is None:
        return prompt or ""
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


def _ntok(text: str) -> int:
    return max(1, len(text.split()))


def _completion(text: str, req: GenerationRequest) -> Completion:
    """`text` as a completion of `req`: cut at its max_tokens (a word counts as a token), as a model's would be."""
    reason = "stop"
    if _ntok(text) > req.max_tokens:
        text, reason = " ".join(text.split()[: req.max_tokens]), "length"
    return Completion(text, _ntok(text), reason, -0.1 * _ntok(text) if req.logprobs else None)


class ScriptedEngine:
    """An Engine whose outputs come from `decide`/`simulate`/`score` callables (keyed by adapter role).

    Requests whose adapter is "simulator" go to `simulate`, all others to `decide`. A responder
    returns one text (repeated n times) or a list of n texts. With `choices`, an output outside the
    list is replaced by its closest choice (what a constrained decoder guarantees); one longer than the request's
    max_tokens (words count as tokens) is cut there, with finish_reason "length". `latency`
    seconds per call and `token_latency` per completion token are slept, to imitate a model.
    `constrained=False` raises NotImplementedError on choices/regex/json_schema, like a plain backend.
    `calls` records ("generate" | "score", requests) for every batched call.
    """

    def __init__(
        self,
        decide: Responder,
        simulate: Responder | None = None,
        score: Scorer | None = None,
        adapters: list[str] | None = None,
        latency: float = 0.0,
        token_latency: float = 0.0,
        constrained: bool = True,
    ) -> None:
        self.decide, self.simulate, self.score_fn = decide, simulate, score
        self.adapters = list(adapters if adapters is not None else ["decider", "simulator"])
        self.simulator_adapter = "simulator"
        self.latency, self.token_latency, self.constrained = latency, token_latency, constrained
        self.usage = EngineUsage()
        self.calls = []

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not self.constrained and any(r.choices or r.regex or r.json_schema for r in requests):
            raise NotImplementedError("ScriptedEngine(constrained=False): constrained decoding is not supported")
        self.calls.append(("generate", list(requests)))
        t0 = time.perf_counter()
        results = []
        for req in requests:
            text = last_user_content(req.messages, req.prompt)
            fn = self.simulate if (req.adapter == self.simulator_adapter and self.simulate) else self.decide
            out = fn(req, text)
            texts = [out] * req.n if isinstance(out, str) else list(out)[: req.n]
            if req.choices:
                texts = [t if t in req.choices else _closest(t, req.choices) for t in texts]
            comps = [_completion(t, req) for t in texts]
            results.append(GenerationResult(comps, _ntok(text), sum(c.num_tokens for c in comps), 0.0))
        self._sleep(sum(r.completion_tokens for r in results))
        dt = time.perf_counter() - t0
        for r in results:
            r.seconds = dt / len(results)
        self.usage.add(EngineUsage(1, len(results), sum(r.prompt_tokens for r in results), 0, dt))
        self.usage.completion_tokens += sum(r.completion_tokens for r in results)
        return results

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        if self.score_fn is None:
            raise NotImplementedError("ScriptedEngine: no score function given")
        self.calls.append(("score", list(requests)))
        t0 = time.perf_counter()
        results = []
        for req in requests:
            text = last_user_content(req.messages, req.prompt)
            lps = [float(x) for x in self.score_fn(req, text)]
            results.append(ScoreResult(lps, [_ntok(c) for c in req.candidates], _ntok(text), 0.0))
        self._sleep(0)
        dt = time.perf_counter() - t0
        self.usage.add(EngineUsage(1, len(results), sum(r.prompt_tokens for r in results), 0, dt))
        return results

    def _sleep(self, tokens: int) -> None:
        delay = self.latency + self.token_latency * tokens
        if delay > 0:
            time.sleep(delay)

    def close(self) -> None:
        pass

    def trained_with(self, role: str, folder: Path, settings: PromptSettings) -> ScriptedEngine:
        """Give the engine's `role` adapter a folder holding `settings` (as `simplan train` copies them from the
        dataset), so a planner on this engine reads them as it reads a real adapter's; returns self."""
        write_settings(folder, settings)
        self.adapter_dirs = {**getattr(self, "adapter_dirs", {}), role: str(folder)}
        return self

    # -- inspection helpers for tests --------------------------------------------------------
    def requests(self, tag: str | None = None) -> list[GenerationRequest | ScoreRequest]:
        return [r for _, reqs in self.calls for r in reqs if tag is None or r.tag == tag]


def _closest(text: str, choices: list[str]) -> str:
    return max(choices, key=lambda c: difflib.SequenceMatcher(None, text, c).ratio())


# ---------------------------------------------------------------------------------------------
# An oracle for the toy env
# ---------------------------------------------------------------------------------------------
def prompt_actions(user_text: str) -> list[str]:
    """The actions of a prompt's history section (data/format.py layout), oldest first."""
    head = SECTION_HISTORY.format(items="")
    if head not in user_text:
        return []
    body = user_text.split(head, 1)[1].split("\n\n" + SECTION_OBSERVATION.format(observation=""), 1)[0]
    return [line[2:].removesuffix(ERROR_MARK) for line in body.splitlines() if line.startswith("> ")]


def prompt_action(user_text: str) -> str:
    """The action a simulator prompt asks about."""
    head = SECTION_ACTION.format(action="")
    return user_text.split(head, 1)[1].split("\n", 1)[0] if head in user_text else ""


def toy_expert_action(env: ToyEnv) -> str:
    """The expert's next command from the toy env's current state."""
    if not env.has_key:
        if env.pos < env.key_room:
            return "go east"
        return "go west" if env.pos > env.key_room else "take key"
    return "go east" if env.pos < env.n_rooms - 1 else "open door"


class ToyOracle:
    """Perfect decider and simulator for one toy task, by replaying a prompt's actions on a fresh env."""

    env_class: type[ToyEnv] = ToyEnv  # a toy variant (a subclass) replays the same way

    def __init__(self, task: Task, confidence: float = 5.0) -> None:
        self.task = task
        self.confidence = confidence  # logprob gap between the expert action and the others

    def _replay(self, actions: list[str]) -> tuple[ToyEnv, str]:
        env = self.env_class()
        text = env.reset(self.task).text
        for a in actions:
            text = env.step(Action.command(a)).observation.text
        return env, text

    def decide(self, req: GenerationRequest, user_text: str) -> str:
        env, _ = self._replay(prompt_actions(user_text))
        return toy_expert_action(env)

    def simulate(self, req: GenerationRequest, user_text: str) -> str:
        _, text = self._replay(prompt_actions(user_text) + [prompt_action(user_text)])
        return text

    def score(self, req: ScoreRequest, user_text: str) -> list[float]:
        env, _ = self._replay(prompt_actions(user_text))
        best = toy_expert_action(env)
        return [0.0 if c == best else -self.confidence for c in req.candidates]

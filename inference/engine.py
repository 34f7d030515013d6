"""The engine interface: batched generation and scoring over a base model and named LoRA adapters.

Backends (inference/engines/): vLLM in-process, an OpenAI-compatible client for a running vLLM
server, and transformers + peft. The planner only sees this protocol, so a scripted engine in
tests is just another implementation.

    results = engine.generate([GenerationRequest(adapter="decider", messages=msgs, n=4, temperature=0.8)])
    scores = engine.score([ScoreRequest(adapter="decider", messages=msgs, candidates=["go east", "look"])])

Every result carries its own token counts and seconds, so callers account cost per episode.
Constrained decoding: `choices` (output is exactly one of them), `regex`, or `json_schema`; a
backend that cannot honour one raises `NotImplementedError` naming the backend and the option.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Messages = list[dict[str, str]]


@dataclass
class GenerationRequest:
    adapter: str | None = None  # "decider", "simulator", or None for the base model
    messages: Messages | None = None  # rendered with the tokenizer's chat template by the engine
    prompt: str | None = None  # or an already-templated prompt string
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False  # fill Completion.logprob (sum of sampled tokens' logprobs)
    choices: list[str] | None = None
    regex: str | None = None
    json_schema: dict[str, Any] | None = None
    seed: int | None = None
    tag: str = ""  # caller's label (e.g. "decide", "simulate") for accounting

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("GenerationRequest: give exactly one of messages or prompt")
        if self.n < 1:
            raise ValueError(f"GenerationRequest.n: must be >= 1, got {self.n}")
        if sum(x is not None for x in (self.choices, self.regex, self.json_schema)) > 1:
            raise ValueError("GenerationRequest: choose at most one of choices, regex, json_schema")
        if self.choices is not None and not self.choices:
            raise ValueError("GenerationRequest.choices: empty list")


@dataclass
class Completion:
    text: str
    num_tokens: int
    finish_reason: str = "stop"  # "stop" | "length"
    logprob: float | None = None
    token_ids: list[int] | None = None  # generated token ids, where the backend exposes them


@dataclass
class GenerationResult:
    completions: list[Completion]
    prompt_tokens: int
    completion_tokens: int
    seconds: float  # this request's share of the batch's wall time


@dataclass
class ScoreRequest:
    """Log-likelihood of each candidate completion after the prompt (e.g. rank valid actions)."""

    candidates: list[str]
    adapter: str | None = None
    messages: Messages | None = None
    prompt: str | None = None
    tag: str = ""

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("ScoreRequest: give exactly one of messages or prompt")
        if not self.candidates:
            raise ValueError("ScoreRequest.candidates: empty list")


@dataclass
class ScoreResult:
    logprobs: list[float]  # sum of token logprobs of each candidate (+ EOS), same order
    num_tokens: list[int]
    prompt_tokens: int
    seconds: float


@dataclass
class EngineUsage:
    calls: int = 0  # batched engine calls
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def add(self, other: EngineUsage) -> None:
        self.calls += other.calls
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds


@runtime_checkable
class Engine(Protocol):
    adapters: list[str]  # names usable as GenerationRequest.adapter
    usage: EngineUsage  # running totals over the engine's life

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Run all requests as one batch; results in request order."""
        ...

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]: ...

    def close(self) -> None: ...


class MeteredEngine:
    """An engine that counts the calls, tokens and seconds passing through it; scoring tokens count as
    prompt tokens. The planner wraps the (possibly shared) engine in one per episode."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.seconds = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        t0 = time.perf_counter()
        results = self.engine.generate(requests)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.prompt_tokens += sum(r.prompt_tokens for r in results)
        self.completion_tokens += sum(r.completion_tokens for r in results)
        return results

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        t0 = time.perf_counter()
        results = self.engine.score(requests)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.prompt_tokens += sum(r.prompt_tokens + sum(r.num_tokens) for r in results)
        return results

"""The engine interface: batched generation and scoring over a base model and named LoRA adapters.

Backends (inference/engines/): vLLM in-process, an OpenAI-compatible client for a running vLLM
server, and transformers + peft. The planner only sees this protocol, so a scripted engine in
tests is just another implementation.

    results = engine.generate([GenerationRequest(adapter="decider", messages=msgs, n=4, temperature=0.8)])
    scores = engine.score([ScoreRequest(adapter="decider", messages=msgs, candidates=["go east", "look"])])

Every result carries its own token counts and seconds, so callers account cost per episode;
`cached_tokens` is the part of `prompt_tokens` the backend reused from an earlier call instead of
prefilling it (vLLM's prefix cache, the hf backend's per-session prefix cache).

Sessions: a request may name its `session` (the planner uses the episode id). A backend that keeps
per-session state (the hf prefix cache) implements `SessionEngine.end_session`, which frees it;
`MeteredEngine` stamps its session on every request and forwards `end_session` where the backend has it.
A session is a hint for reuse, never for correctness: a cached prefix is used only where the new
prompt's tokens start with it.
Drafts: a greedy request may carry a `draft`, a guess at its completion (the planner's: the real observation a
prediction is compared with). A backend that checks drafts (hf) runs the prompt and the draft in one forward and
keeps the draft's leading tokens that are the model's own greedy choices, so those tokens cost no decode steps;
the completion is the one greedy decoding gives without the draft. Backends that do not check drafts ignore it.
Constrained decoding: `choices` (output is exactly one of them), `regex`, or `json_schema`; a
backend that cannot honour one raises `NotImplementedError` naming the backend and the option.

Model text is untrusted: `MeteredEngine` (every planner call goes through it) checks each backend's
results against this protocol (`EngineContractError` otherwise) and passes every completion text
through `sanitize_text` before anyone hashes, parses or writes it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
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
    logprobs: bool = False  # fill Completion.logprob (sum of sampled tokens' logprobs) and min_logprob
    choices: list[str] | None = None
    regex: str | None = None
    json_schema: dict[str, Any] | None = None
    seed: int | None = None
    tag: str = ""  # caller's label (e.g. "decide", "simulate") for accounting
    session: str | None = None  # the caller's episode: backends may reuse its earlier prompts' prefill
    # A guess at the completion, for a greedy request: the same output, fewer decode steps where the guess is right
    # (module docstring, "Drafts"); never part of the prompt.
    draft: str | None = None

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
    logprob: float | None = None  # sum of the sampled tokens' logprobs (when requested and the backend can)
    token_ids: list[int] | None = None  # generated token ids, where the backend exposes them
    min_logprob: float | None = None  # the least likely sampled token's logprob, where the backend exposes it

    @property
    def mean_logprob(self) -> float | None:
        """Mean token logprob of the text: the model's confidence in it, comparable across lengths (the
        planner's per-prediction simulator confidence); None where the backend gave no logprob."""
        if self.logprob is None or self.num_tokens <= 0:
            return None
        return self.logprob / self.num_tokens


@dataclass
class GenerationResult:
    completions: list[Completion]
    prompt_tokens: int
    completion_tokens: int
    seconds: float  # this request's share of the batch's wall time
    cached_tokens: int = 0  # of prompt_tokens, those reused from an earlier call (not prefilled again)


@dataclass
class ScoreRequest:
    """Log-likelihood of each candidate completion after the prompt (e.g. rank valid actions)."""

    candidates: list[str]
    adapter: str | None = None
    messages: Messages | None = None
    prompt: str | None = None
    tag: str = ""
    session: str | None = None  # as GenerationRequest.session
    # True: each candidate is a whole completion, scored with its end-of-turn token (an action). False: each is
    # the start of a longer completion, scored without one (a simulator reply's outcome line).
    complete: bool = True

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("ScoreRequest: give exactly one of messages or prompt")
        if not self.candidates:
            raise ValueError("ScoreRequest.candidates: empty list")


@dataclass
class ScoreResult:
    logprobs: list[float]  # sum of token logprobs of each candidate (+ EOS when the request is complete), in order
    num_tokens: list[int]
    prompt_tokens: int
    seconds: float
    cached_tokens: int = 0  # of prompt_tokens, those reused from an earlier call (not prefilled again)


@dataclass
class EmbedRequest:
    """One text to embed: the mean of the model's last hidden states over the text's tokens, L2-normalised (an
    embedding from the model already loaded: nothing to download). `adapter` None: the base model."""

    text: str
    adapter: str | None = None
    tag: str = "embed"


@dataclass
class EmbedResult:
    vector: list[float]  # unit length (all zeros for a text of no tokens)
    prompt_tokens: int
    seconds: float
    cached_tokens: int = 0  # (none: accounted like the other results)


def cosine(a: list[float], b: list[float]) -> float:
    """Cosine similarity of two vectors; 0.0 when either is all zeros."""
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    if not na or not nb:
        return 0.0
    return sum(x * y for x, y in zip(a, b)) / (na * nb)


def softmax(logprobs: list[float]) -> list[float]:
    """A score result's logprobs as probabilities of a choice among its candidates; uniform when all are -inf
    (nothing to prefer), [] for none."""
    if not logprobs:
        return []
    m = max(logprobs)
    if m == -math.inf:
        return [1.0 / len(logprobs)] * len(logprobs)
    exps = [math.exp(x - m) for x in logprobs]
    z = sum(exps)
    return [e / z for e in exps]


def log_softmax(logprobs: list[float]) -> list[float]:
    """The logarithms of `softmax(logprobs)`, computed without leaving log space."""
    if not logprobs:
        return []
    m = max(logprobs)
    if m == -math.inf:
        return [-math.log(len(logprobs))] * len(logprobs)
    z = math.log(sum(math.exp(x - m) for x in logprobs)) + m
    return [x - z for x in logprobs]


@dataclass
class EngineUsage:
    calls: int = 0  # batched engine calls
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cached_tokens: int = 0  # of prompt_tokens, those reused instead of prefilled

    def add(self, other: EngineUsage) -> None:
        self.calls += other.calls
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds
        self.cached_tokens += other.cached_tokens


@runtime_checkable
class Engine(Protocol):
    adapters: list[str]  # names usable as GenerationRequest.adapter
    usage: EngineUsage  # running totals over the engine's life

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Run all requests as one batch; results in request order."""
        ...

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]: ...

    def close(self) -> None: ...


@runtime_checkable
class SessionEngine(Protocol):
    """The optional hook of a backend that keeps state per request session (the hf prefix cache).

    Backends without it need nothing: `MeteredEngine.end_session` calls it only where it exists."""

    def end_session(self, session: str) -> None:
        """Free what the backend keeps for `session` (a session never seen is not an error)."""
        ...


@runtime_checkable
class EmbeddingEngine(Protocol):
    """The optional hook of a backend that embeds texts (hf; the merged engine through its sub-engines): the
    expectation-mismatch pivot's `embedding` similarity uses it. `MeteredEngine.embed` says which backend lacks
    it (NotImplementedError)."""

    def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]: ...


@runtime_checkable
class EnvBoundEngine(Protocol):
    """The optional hook of an engine that decides from the env itself, with no model (the expert and random
    engines, inference/engines/model_free.py): `bind(env)` returns the engine and the env one episode uses (the
    env wrapped so the engine sees each observation). Such an engine has no model calls to batch, and it serves
    the decider's role only (the reactive arm)."""

    def bind(self, env: Any) -> tuple[Any, Any]: ...


# ---------------------------------------------------------------------------------------------
# The boundary: results checked against the protocol, model text made safe
# ---------------------------------------------------------------------------------------------
# Far above what a completion of the planner's max_tokens holds (the longest BFCL ground-truth call is
# 6,839 characters), low enough that hashing, similarity and trace writing stay cheap on runaway text.
DEFAULT_MAX_TEXT_CHARS = 8000
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class EngineContractError(RuntimeError):
    """A backend returned results that break the engine protocol: the backend's fault, not the model text's.

    The planner lets it end the episode as "errored" with this message; the evaluation goes on.
    """


def sanitize_text(text: str, max_chars: int = DEFAULT_MAX_TEXT_CHARS) -> str:
    """Model text made safe to hash, parse and write as UTF-8: lone surrogates (which no UTF-8 encoder
    accepts) become U+FFFD, NUL bytes are removed, and the text is cut to `max_chars` characters."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _SURROGATE.sub("\ufffd", text)
    return text.replace("\x00", "")[:max_chars]


def backend(engine: Any) -> Any:
    """The backend under any wrappers (MeteredEngine, BatchingEngine)."""
    seen = 0
    while seen < 8 and (inner := getattr(engine, "engine", None) or getattr(engine, "inner", None)) is not None:
        engine, seen = inner, seen + 1
    return engine


def backend_name(engine: Any) -> str:
    """The class name of the backend under any wrappers, for error messages."""
    return type(backend(engine)).__name__


def can_embed(engine: Any) -> bool:
    """Whether the backend under any wrappers implements the optional EmbeddingEngine hook."""
    return isinstance(backend(engine), EmbeddingEngine)


def _broken(engine: Any, tag: str, what: str) -> EngineContractError:
    return EngineContractError(
        f"{backend_name(engine)}: {what} (request tag {tag!r}); the engine backend broke its protocol "
        "(inference/engines/base.py), fix or update the backend"
    )


def _bad_logprob(x: Any) -> bool:
    """NaN or +inf, or not a number: a log-probability no model produces (-inf is a legal zero probability)."""
    return not isinstance(x, numbers.Real) or math.isnan(x) or x == math.inf


def checked_generation(
    engine: Any,
    requests: list[GenerationRequest],
    results: list[GenerationResult],
    max_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> list[GenerationResult]:
    """`results` of `engine.generate(requests)` checked against the protocol, with every text sanitized.

    Raises EngineContractError for a wrong number of results, a result without completions, a text
    that is not a string, or a NaN/+inf logprob. Returns new result objects (the backend's are not changed).
    """
    if not isinstance(results, list) or len(results) != len(requests):
        got = len(results) if isinstance(results, list) else type(results).__name__
        tag = requests[0].tag if requests else ""
        raise _broken(engine, tag, f"generate returned {got} results for {len(requests)} requests")
    out = []
    for req, res in zip(requests, results):
        if not res.completions:
            raise _broken(engine, req.tag, f"a GenerationResult with no completions for a request with n={req.n}")
        completions = []
        for c in res.completions:
            if not isinstance(c.text, str):
                raise _broken(engine, req.tag, f"a completion text of type {type(c.text).__name__}, not str")
            for name in ("logprob", "min_logprob"):
                value = getattr(c, name)
                if value is not None and _bad_logprob(value):
                    raise _broken(engine, req.tag, f"a completion {name} of {value!r}")
            completions.append(dataclasses.replace(c, text=sanitize_text(c.text, max_chars)))
        out.append(dataclasses.replace(res, completions=completions))
    return out


def checked_scores(engine: Any, requests: list[ScoreRequest], results: list[ScoreResult]) -> list[ScoreResult]:
    """`results` of `engine.score(requests)` checked against the protocol: one result per request, one
    finite-or--inf logprob and one token count per candidate. Raises EngineContractError otherwise."""
    if not isinstance(results, list) or len(results) != len(requests):
        got = len(results) if isinstance(results, list) else type(results).__name__
        tag = requests[0].tag if requests else ""
        raise _broken(engine, tag, f"score returned {got} results for {len(requests)} requests")
    for req, res in zip(requests, results):
        n = len(req.candidates)
        if len(res.logprobs) != n or len(res.num_tokens) != n:
            raise _broken(
                engine,
                req.tag,
                f"a ScoreResult with {len(res.logprobs)} logprobs and {len(res.num_tokens)} token counts "
                f"for {n} candidates",
            )
        bad = [x for x in res.logprobs if _bad_logprob(x)]
        if bad:
            raise _broken(engine, req.tag, f"a ScoreResult with logprob(s) {bad[:3]!r}")
    return results


class MeteredEngine:
    """An engine that counts the calls, tokens and seconds passing through it; scored candidates' tokens count
    as prompt tokens, and of `prompt_tokens`, `candidate_tokens` are those (each candidate + EOS, in full)
    and `cached_tokens` those the backend reused, so the context prefilled is prompt - cached - candidates.
    The planner wraps the (possibly shared) engine in one per episode, with the episode id as `session`:
    every request without a session gets it, and `end_session()` frees the backend's state for it.

    It is also the boundary where model output enters the planner: results are checked against the
    protocol (EngineContractError) and completion texts sanitized (`sanitize_text`, `max_text_chars`)."""

    def __init__(
        self, engine: Engine, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS, session: str | None = None
    ) -> None:
        if max_text_chars < 1:
            raise ValueError(f"MeteredEngine.max_text_chars: must be >= 1, got {max_text_chars}")
        self.engine = engine
        self.max_text_chars = max_text_chars
        self.session = session
        self.calls = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.candidate_tokens = 0
        self.completion_tokens = 0
        self.seconds = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        requests = self._in_session(requests)
        t0 = time.perf_counter()
        results = self.engine.generate(requests)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        results = checked_generation(self.engine, requests, results, self.max_text_chars)
        self.prompt_tokens += sum(r.prompt_tokens for r in results)
        self.cached_tokens += sum(r.cached_tokens for r in results)
        self.completion_tokens += sum(r.completion_tokens for r in results)
        return results

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        requests = self._in_session(requests)
        t0 = time.perf_counter()
        results = self.engine.score(requests)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        results = checked_scores(self.engine, requests, results)
        candidates = sum(sum(r.num_tokens) for r in results)
        self.prompt_tokens += sum(r.prompt_tokens for r in results) + candidates
        self.cached_tokens += sum(r.cached_tokens for r in results)
        self.candidate_tokens += candidates
        return results

    def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        """Embed texts (the optional EmbeddingEngine hook); NotImplementedError naming a backend without it."""
        if not callable(getattr(self.engine, "embed", None)):
            raise NotImplementedError(f"engine {backend_name(self.engine)}: cannot embed texts (hf can)")
        t0 = time.perf_counter()
        results = self.engine.embed(requests)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        if len(results) != len(requests):
            raise _broken(self.engine, "embed", f"{len(results)} results for {len(requests)} requests")
        self.prompt_tokens += sum(r.prompt_tokens for r in results)
        return results

    def _in_session(self, requests: list[Any]) -> list[Any]:
        if self.session is None:
            return requests
        return [r if r.session is not None else dataclasses.replace(r, session=self.session) for r in requests]

    def end_session(self) -> None:
        """Free the backend's state for this meter's session (no-op without a session or the hook)."""
        if self.session is not None and isinstance(self.engine, SessionEngine):
            self.engine.end_session(self.session)

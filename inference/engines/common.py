"""Helpers every backend shares, so all three tokenize and account identically.

Prompts become token ids here (chat messages through data/format.prompt_text, the same function
dataset building uses), and scoring rows are `prompt ids + candidate ids + EOS`, so the HF,
vLLM and server backends see the exact same tokens for the same request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from simplan.data.format import prompt_text
from simplan.inference.engines.base import (
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
    ScoreResult,
)


def request_prompt(tokenizer: Any, req: GenerationRequest | ScoreRequest) -> str:
    """The templated prompt string of a request (messages -> chat template, or the given prompt)."""
    return prompt_text(tokenizer, req.messages) if req.messages is not None else req.prompt  # type: ignore[return-value]


def encode(tokenizer: Any, text: str) -> list[int]:
    # The chat template already holds any special tokens the model expects; adding BOS again would make
    # prompts differ from training rows.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer: Any, req: GenerationRequest | ScoreRequest) -> list[int]:
    return encode(tokenizer, request_prompt(tokenizer, req))


def sampling_kwargs(r: GenerationRequest) -> dict[str, Any]:
    """The sampling fields of a request, named as vLLM's SamplingParams and the OpenAI API both name them."""
    return {
        "n": r.n,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "max_tokens": r.max_tokens,
        "stop": list(r.stop) or None,
        "logprobs": 0 if r.logprobs else None,  # 0: only the sampled token's logprob
        "seed": r.seed,
    }


def structured_outputs(r: GenerationRequest) -> dict[str, Any] | None:
    """The request's decoding constraint as vLLM's structured-outputs fields (choice | regex | json), or None."""
    if r.choices is not None:
        return {"choice": list(r.choices)}
    if r.regex is not None:
        return {"regex": r.regex}
    if r.json_schema is not None:
        return {"json": r.json_schema}
    return None


@dataclass
class ScoreRow:
    """One candidate of one ScoreRequest as token ids: logprob is summed over ids[start:]."""

    request: int
    candidate: int
    ids: list[int]
    start: int


def score_rows(tokenizer: Any, requests: Sequence[ScoreRequest]) -> tuple[list[ScoreRow], list[int]]:
    """Rows (prompt + candidate, + EOS for a complete request) for every candidate, and each request's prompt
    length."""
    rows: list[ScoreRow] = []
    lengths: list[int] = []
    eos = tokenizer.eos_token_id
    for i, req in enumerate(requests):
        p = prompt_ids(tokenizer, req)
        lengths.append(len(p))
        for j, cand in enumerate(req.candidates):
            tail = encode(tokenizer, cand) + ([eos] if eos is not None and req.complete else [])
            rows.append(ScoreRow(i, j, p + tail, len(p)))
    return rows, lengths


def score_results(
    requests: Sequence[ScoreRequest],
    rows: Sequence[ScoreRow],
    row_logprobs: Sequence[float],
    lengths: list[int],
    sec: float,
) -> list[ScoreResult]:
    """Per-request results from per-row logprobs (`sec` is split evenly over the requests)."""
    logprobs = [[0.0] * len(r.candidates) for r in requests]
    ntok = [[0] * len(r.candidates) for r in requests]
    for row, lp in zip(rows, row_logprobs):
        logprobs[row.request][row.candidate] = float(lp)
        ntok[row.request][row.candidate] = len(row.ids) - row.start
    share = sec / max(len(requests), 1)
    return [ScoreResult(logprobs[i], ntok[i], lengths[i], share) for i in range(len(requests))]


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` before the earliest stop string (vLLM's behaviour: the stop string is not returned)."""
    cut = min((i for s in stop if s and (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def check_adapter(name: str | None, adapters: Sequence[str], backend: str) -> None:
    if name is not None and name not in adapters:
        known = ", ".join(adapters) or "none"
        raise KeyError(f"{backend}: unknown adapter {name!r}; this engine has: {known} (use None for the base model)")


def account(usage: EngineUsage, results: Sequence[GenerationResult | ScoreResult], sec: float) -> None:
    """Add one batched call to the running totals."""
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results if isinstance(r, GenerationResult))
    cached = sum(r.cached_tokens for r in results)
    usage.add(EngineUsage(1, len(results), prompt, completion, sec, cached_tokens=cached))


@contextmanager
def timer() -> Iterator[list[float]]:
    """`with timer() as t: ...` then t[0] is the elapsed seconds."""
    box = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start

"""OpenAI-compatible client backend for a running vLLM server (`simplan serve`).

    simplan serve --model smollm2-135m-instruct --adapters decider=runs/decider,simulator=runs/sim
    engine = make_engine("openai", "smollm2-135m-instruct", {"decider": "", "simulator": ""},
                         base_url="http://127.0.0.1:8000/v1")

An adapter is addressed by its served LoRA module name, the base model by the served model name.
Requests use the completions API with token-id prompts built locally from the chat template
(data/format.prompt_text), so the server sees exactly the tokens training used; this needs the
model's tokenizer here (`tokenizer=` option, default: the model name). Each request of a batch is
one HTTP call, sent concurrently from a thread pool. Constrained decoding goes through vLLM's
`structured_outputs` extra field; scoring uses vLLM's `prompt_logprobs` extension.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from simplan.inference.engines.base import (
    Completion,
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
    ScoreResult,
)
from simplan.inference.engines.common import (
    ScoreRow,
    account,
    check_adapter,
    prompt_ids,
    sampling_kwargs,
    score_results,
    score_rows,
    structured_outputs,
    timer,
)

BACKEND = "openai"


class OpenAIEngine:
    """Engine protocol over an OpenAI-compatible vLLM server (see the module docstring)."""

    def __init__(
        self,
        model: str,
        adapters: dict[str, str] | list[str] | None = None,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        max_in_flight: int = 16,
        tokenizer: str | None = None,
        timeout: float = 600.0,
        sequential_scoring: bool = True,
    ) -> None:
        import openai

        from simplan.models.registry import ModelNotFoundError, load_tokenizer

        self.model = model
        self.adapters = list(adapters or [])
        self.usage = EngineUsage()
        self.base_url = base_url
        # vLLM 0.32 CPU bug: prompt_logprobs with LoRA enabled crash the server's engine when a step holds more
        # than one request (see vllm_local.py). Safe default: score one row per call, one call at a time. A GPU
        # server is not affected: pass sequential_scoring=False there for batched, concurrent scoring.
        self.sequential_scoring = sequential_scoring
        try:
            self.tokenizer = load_tokenizer(tokenizer or model)
        except (OSError, ValueError) as e:
            raise ModelNotFoundError(  # the user's to fix (a usage error, exit 2), as a missing --model is
                f"{BACKEND} backend: cannot load a local tokenizer for {tokenizer or model!r} ({e}); pass "
                "tokenizer=<local HF folder or registry name> with the served model's tokenizer"
            ) from None
        key = api_key or os.environ.get("SIMPLAN_API_KEY") or "EMPTY"  # vLLM without --api-key accepts any key
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=0)
        self.pool = ThreadPoolExecutor(max_workers=max(1, max_in_flight), thread_name_prefix="simplan-openai")

    def _model_name(self, adapter: str | None) -> str:
        check_adapter(adapter, self.adapters, BACKEND)
        return self.model if adapter is None else adapter

    # ------------------------------------------------------------------ generate
    def _one(self, r: GenerationRequest) -> GenerationResult:
        extra: dict[str, Any] = {"return_token_ids": True}
        constraint = structured_outputs(r)
        if constraint is not None:
            extra["structured_outputs"] = constraint
        ids = prompt_ids(self.tokenizer, r)
        with timer() as t:
            resp = self.client.completions.create(
                model=self._model_name(r.adapter), prompt=ids, **sampling_kwargs(r), extra_body=extra
            )
        comps = []
        for c in sorted(resp.choices, key=lambda c: c.index):
            token_ids = getattr(c, "token_ids", None)
            lp = low = None
            if r.logprobs and c.logprobs is not None:
                values = [float(x) for x in c.logprobs.token_logprobs if x is not None]
                lp, low = float(sum(values)), (min(values) if values else None)
            n_tok = len(token_ids) if token_ids is not None else len(self.tokenizer(c.text)["input_ids"])
            reason = "length" if c.finish_reason == "length" else "stop"
            comps.append(Completion(text=c.text, num_tokens=n_tok, finish_reason=reason, logprob=lp, min_logprob=low))
        prompt_tokens = resp.usage.prompt_tokens if resp.usage else len(ids)
        return GenerationResult(comps, prompt_tokens, sum(c.num_tokens for c in comps), t[0])

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        for r in requests:
            self._model_name(r.adapter)
        with timer() as t:
            results = list(self.pool.map(self._one, requests))
        account(self.usage, results, t[0])
        return results

    # ------------------------------------------------------------------ score
    def _score_one(self, adapter: str | None, rows: list[ScoreRow]) -> list[float]:
        """One call scoring several rows (a batch prompt of token-id lists) via prompt_logprobs."""
        resp = self.client.completions.create(
            model=self._model_name(adapter),
            prompt=[row.ids for row in rows],
            max_tokens=1,
            temperature=0.0,
            extra_body={"prompt_logprobs": 0},
        )
        out = [0.0] * len(rows)
        for c in resp.choices:
            plp = getattr(c, "prompt_logprobs", None)
            if plp is None:
                raise RuntimeError(
                    f"{BACKEND} backend: the server at {self.base_url} returned no prompt_logprobs; scoring needs a "
                    "vLLM server (simplan serve)"
                )
            row = rows[c.index]
            # entry p: {token_id: {logprob, ...}} for ids[p] given ids[:p]; JSON keys are strings.
            out[c.index] = sum(_logprob_of(plp[p], row.ids[p]) for p in range(row.start, len(row.ids)))
        return out

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        rows, lengths = score_rows(self.tokenizer, requests)
        for r in requests:
            self._model_name(r.adapter)
        if self.sequential_scoring:
            groups = [[row] for row in rows]
        else:
            groups = [[row for row in rows if row.request == i] for i in range(len(requests))]

        def run(group: list[ScoreRow]) -> list[float]:
            return self._score_one(requests[group[0].request].adapter, group)

        with timer() as t:
            values = [run(g) for g in groups] if self.sequential_scoring else list(self.pool.map(run, groups))
        flat_rows = [row for group in groups for row in group]
        flat_values = [v for group in values for v in group]
        results = score_results(requests, flat_rows, flat_values, lengths, t[0])
        account(self.usage, results, t[0])
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


def _logprob_of(entry: dict[Any, Any], token: int) -> float:
    value = entry.get(str(token), entry.get(token))
    if value is None:
        raise RuntimeError(f"prompt_logprobs entry lacks token {token}: {list(entry)[:5]}")
    return float(value["logprob"] if isinstance(value, dict) else value.logprob)

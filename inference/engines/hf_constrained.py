"""Constrained decoding for the hf backend: a choice list scored and picked, regex / json_schema via xgrammar.

    from simplan.inference.engines.hf_constrained import GrammarCache, pick_choices
    grammars = GrammarCache(tokenizer, vocab_size, eos_id, backend="hf")
    grammar = grammars.get(request)              # None without regex / json_schema; compiled once per pattern
    picks = pick_choices(logprobs, request)      # request.n indices into request.choices

Choices are exact: every choice is scored with the model (inference/engines/hf_peft.py), then the best one
is taken (temperature 0) or n are sampled from the choices' distribution at the request's temperature and
top_p. Regex and JSON-schema requests go through xgrammar (the grammar engine vLLM uses, installed with it)
as a logits processor; JSON is generated compact (no free whitespace). Without xgrammar they raise
NotImplementedError naming what to install.
"""

from __future__ import annotations

import json
from typing import Any

from simplan.inference.engines.base import GenerationRequest


class GrammarCache:
    """The xgrammar grammars of one tokenizer's regex / json_schema requests, each compiled once."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_id: int, backend: str) -> None:
        self.tokenizer, self.vocab_size, self.eos_id, self.backend = tokenizer, vocab_size, eos_id, backend
        self._grammars: dict[tuple[str, str], Any] = {}  # (kind, pattern) -> xgrammar CompiledGrammar
        self._compiler: Any = None

    def get(self, r: GenerationRequest) -> Any:
        """The compiled xgrammar grammar of a regex / json_schema request (cached), or None."""
        key = grammar_key(r)
        if key is None:
            return None
        if key not in self._grammars:
            try:
                import xgrammar as xgr
            except ImportError as e:
                raise NotImplementedError(
                    f"{self.backend} backend: constrained decoding by {key[0]} needs xgrammar "
                    "(pip install xgrammar, or install vllm, which brings it); or use choices=, or the vllm / openai "
                    "backend"
                ) from e
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=[self.eos_id]
                )
                self._compiler = xgr.GrammarCompiler(info)
            kind, pattern = key
            if kind == "regex":
                self._grammars[key] = self._compiler.compile_regex(pattern)
            else:
                self._grammars[key] = self._compiler.compile_json_schema(pattern, any_whitespace=False)
        return self._grammars[key]


def pick_choices(lp: Any, r: GenerationRequest) -> list[int]:
    """`r.n` indices into `r.choices` from their logprobs `lp` (a float64 tensor): the best one when greedy, else
    samples at `r.temperature` from the smallest set of choices reaching `r.top_p` (seeded by `r.seed`)."""
    import torch

    if r.temperature <= 0:
        return [int(lp.argmax())] * r.n
    probs = torch.softmax(lp / r.temperature, dim=0)
    if r.top_p < 1.0:
        order = torch.argsort(probs, descending=True)
        cum = torch.cumsum(probs[order], 0)
        drop = order[(cum - probs[order]) >= r.top_p]  # keep the smallest set reaching top_p
        probs[drop] = 0.0
        probs /= probs.sum()
    gen = torch.Generator().manual_seed(r.seed) if r.seed is not None else None
    return torch.multinomial(probs, r.n, replacement=True, generator=gen).tolist()


def grammar_key(r: GenerationRequest) -> tuple[str, str] | None:
    if r.regex is not None:
        return ("regex", r.regex)
    if r.json_schema is not None:
        return ("json", json.dumps(r.json_schema, sort_keys=True))
    return None

"""transformers + peft backend: one base model with every LoRA adapter loaded, for machines without vLLM.

    from simplan.inference.engines import make_engine
    engine = make_engine("hf", "smollm2-135m-instruct", {"decider": "runs/decider", "simulator": "runs/sim"})
    engine.generate([GenerationRequest(adapter="decider", messages=msgs)])

Requests are grouped by adapter (and sampling settings); each group runs as left-padded batched
`generate` calls with that adapter active (`set_adapter`), base-model requests under
`disable_adapter()`. Constrained decoding supports `choices` exactly (every choice is scored and
the best one taken, or n sampled), `regex` and `json_schema` through xgrammar
(inference/engines/hf_constrained.py). Scoring runs a request's prompt once and its candidates after it
as one token trie (inference/engines/token_trie.py).

Prefix cache (`prefix_cache_sessions`, default 16; 0 turns it off; inference/engines/prefix_cache.py).
The planner's conversation prompts grow by one turn per step and every rollout branch of a step extends
the same prompt, so most of a prompt was already prefilled by the session's previous call. Per live
session (the request's `session`, the episode id) and adapter (the keys and values depend on the LoRA),
the engine keeps the KV cache (a transformers DynamicCache) of the session's latest prompt; a new
prompt prefills only the tokens after its longest common prefix with it (cropping the cache where the
prompts diverge), and its cache replaces the old one. Sessions are evicted least-recently used beyond
`prefix_cache_sessions`, and freed by `end_session` (the planner calls it when an episode ends). The
rule under batching:

- generate: when any request of a batch has a session, each prompt is prefilled alone from its own
  session's cache (cold for a request without one), the rows' caches less their last token are
  stacked left-padded into one batch cache, and the batch decodes together as before (generate then
  runs only each prompt's last token again). Batches mixing sessions are thus served exactly; a
  batch without sessions takes the old one-call path.
- score (shared_prefix_scoring): each request's prompt pass already runs alone; it prefills from the
  session's cache, then the candidates' token trie runs on it and is cropped off again, except where a
  request has one candidate: its tokens continue the prompt (the simulator's scored real observation is
  how its next prompt goes on), so the session keeps prompt and candidate. Scoring without shared
  prefixes does not use the cache.

Memory: one cache per (session, adapter), about 46 KB per token for SmolLM2-135M in fp32 (30 layers x
keys and values x 3 KV heads x 64), so 16 sessions x 2 adapters x 600 tokens is ~0.9 GB (half in
bf16). Models whose cache is not a plain DynamicCache (sliding windows) run without it. Results
report `cached_tokens`: the prompt tokens reused instead of prefilled.

Drafts (base.py "Drafts"): a greedy request with a `draft` runs its prompt and the draft in one forward and
keeps the draft's leading tokens that are the model's greedy choices, plus the choice after them; only what is
left decodes, prefilled from the session's cache. The completion is greedy decoding's (float32: the same tokens;
the one forward's logits differ from decoding's by summation order).

KV caches grow in place (kv_cache.py `GrowingLayer`, switch: `growing_kv`): keys and values live in
buffers with spare room instead of DynamicCache's torch.cat of the whole cache at every decoded token.
A generate call's buffers get room for its max_tokens at prefill; a session's cached prompt keeps at
most `kv_spare` (64) free tokens (trimmed when stored), so the memory above grows by that per cache.
Models whose cache is not a plain DynamicCache keep transformers' caches.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from simplan.inference.engines.base import (
    Completion,
    EmbedRequest,
    EmbedResult,
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
    encode,
    prompt_ids,
    score_results,
    score_rows,
    timer,
    truncate_at_stop,
)
from simplan.inference.engines.hf_constrained import GrammarCache, grammar_key, pick_choices
from simplan.inference.engines.kv_cache import CHUNK, GrowingLayer, growing_cache, stacked_cache
from simplan.inference.engines.prefix_cache import Prefix, PrefixCache, common_prefix, crop, plain_dynamic_cache
from simplan.inference.engines.token_trie import inner_nodes, path_logprobs, token_trie, trie_attention

BACKEND = "hf"
TRIE_CANDIDATES = 256  # candidates scored in one token tree over a shared prompt (bounds its logits' memory)


def checks_draft(r: GenerationRequest) -> bool:
    """Whether this backend checks the request's draft (base.py "Drafts"): greedy decoding of one completion with no
    constraint or stop string, where each draft token is exactly one that greedy decoding takes or not."""
    return (
        r.draft is not None
        and r.temperature == 0
        and r.n == 1
        and not r.stop
        and r.regex is None
        and r.json_schema is None
        and r.choices is None
    )


class HFPeftEngine:
    """Engine protocol over transformers + peft (see the module docstring)."""

    def __init__(
        self,
        model: str,
        adapters: dict[str, str] | None = None,
        dtype: str = "auto",
        threads: int | None = None,
        batch_size: int = 16,
        shared_prefix_scoring: bool = True,
        device: str = "auto",
        prefix_cache_sessions: int = 16,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        from simplan.models.registry import checkpoint_dtype, load_tokenizer, pick_device, resolve_dtype, resolve_model

        if prefix_cache_sessions < 0:
            raise ValueError(
                f"HFPeftEngine.prefix_cache_sessions: must be >= 0 (0 turns it off), got {prefix_cache_sessions}"
            )
        if threads is not None:
            # OpenMP threads spin: more threads than free cores slows everything on a shared CPU.
            torch.set_num_threads(threads)
        self.torch = torch
        self.batch_size = batch_size
        self.shared_prefix_scoring = shared_prefix_scoring  # one prompt pass per ScoreRequest
        self.adapters = list(adapters or {})
        self.usage = EngineUsage()
        path = resolve_model(model)
        self.tokenizer = load_tokenizer(path)
        self.device = pick_device(device)
        dtype = resolve_dtype(dtype, self.device, checkpoint_dtype(path))  # auto: no emulated bf16 on a CPU
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(self.device)
        self.model: Any = base
        if adapters:
            from peft import PeftModel

            items = list(adapters.items())
            self.model = PeftModel.from_pretrained(base, items[0][1], adapter_name=items[0][0])
            for name, adapter_path in items[1:]:
                self.model.load_adapter(adapter_path, adapter_name=name)
        self.model.eval()
        self.vocab_size = int(base.config.vocab_size)
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        self.grammars = GrammarCache(self.tokenizer, self.vocab_size, self.eos_id, BACKEND)
        self.config = base.config
        plain = plain_dynamic_cache(base.config)
        self.prefixes = PrefixCache(prefix_cache_sessions) if prefix_cache_sessions > 0 and plain else None
        # Decode into preallocated KV buffers instead of DynamicCache's per-token torch.cat of the whole cache
        # (kv_cache.py); only for plain full-attention caches, the ones GrowingLayer replaces exactly.
        self.growing_kv = plain
        self.kv_spare = CHUNK  # free room a cached session prompt keeps: bounds the prefix cache's extra memory
        self._kv_layers = len(DynamicCache(config=base.config).layers)

    def end_session(self, session: str) -> None:
        """Free the session's cached prefixes (the planner calls it when an episode ends)."""
        if self.prefixes is not None:
            self.prefixes.end(session)

    # ------------------------------------------------------------------ adapters
    @contextlib.contextmanager
    def _use(self, adapter: str | None) -> Iterator[None]:
        check_adapter(adapter, self.adapters, BACKEND)
        if not self.adapters:
            yield
        elif adapter is None:
            with self.model.disable_adapter():
                yield
        else:
            self.model.set_adapter(adapter)
            yield

    # ------------------------------------------------------------------ generate
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        for r in requests:
            check_adapter(r.adapter, self.adapters, BACKEND)
            self.grammars.get(r)  # compile (or refuse) before any work
        results: list[GenerationResult | None] = [None] * len(requests)
        with timer() as t:
            free: dict[tuple, list[int]] = defaultdict(list)
            drafted: dict[tuple, list[int]] = defaultdict(list)
            for i, r in enumerate(requests):
                if r.choices is not None:
                    results[i] = self._choose(r)
                elif checks_draft(r):
                    drafted[(r.adapter, r.logprobs)].append(i)
                else:
                    key = (
                        r.adapter,
                        r.n,
                        r.temperature,
                        r.top_p,
                        r.max_tokens,
                        tuple(r.stop),
                        r.seed,
                        r.logprobs,
                        grammar_key(r),
                    )
                    free[key].append(i)
            for idx in free.values():
                step = max(1, self.batch_size // requests[idx[0]].n)  # batch_size counts rows (prompts x n)
                for k in range(0, len(idx), step):
                    chunk = idx[k : k + step]
                    for i, res in zip(chunk, self._generate_batch([requests[i] for i in chunk])):
                        results[i] = res
            for idx in drafted.values():
                for k in range(0, len(idx), self.batch_size):
                    chunk = idx[k : k + self.batch_size]
                    for i, res in zip(chunk, self._drafted([requests[i] for i in chunk])):
                        results[i] = res
        out = [r for r in results if r is not None]
        for r in out:
            r.seconds = t[0] / len(out)
        account(self.usage, out, t[0])
        return out

    def _left_pad(self, rows: Sequence[list[int]]) -> tuple[Any, Any]:
        width = max(len(r) for r in rows)
        ids = self.torch.full((len(rows), width), self.pad_id, dtype=self.torch.long)
        mask = self.torch.zeros((len(rows), width), dtype=self.torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = self.torch.tensor(r, dtype=self.torch.long)
            mask[i, width - len(r) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _generate_batch(
        self, reqs: list[GenerationRequest], prompts: list[list[int]] | None = None
    ) -> list[GenerationResult]:
        """Same adapter and sampling settings: one left-padded `generate` call. `prompts`: the rows' token ids
        where they are not the requests' own prompts (a drafted request's continuation); a row stops at its own
        max_tokens."""
        from transformers import GenerationConfig

        torch = self.torch
        r0 = reqs[0]
        prompts = prompts if prompts is not None else [prompt_ids(self.tokenizer, r) for r in reqs]
        ids, mask = self._left_pad(prompts)
        sample = r0.temperature > 0
        width = max(r.max_tokens for r in reqs)
        gen = GenerationConfig(
            max_new_tokens=width,
            do_sample=sample,
            temperature=r0.temperature if sample else None,
            top_p=r0.top_p if sample else None,
            top_k=None,  # vLLM's default is no top-k; match it
            num_return_sequences=r0.n,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            stop_strings=list(r0.stop) or None,
            return_dict_in_generate=True,
            output_logits=r0.logprobs,
        )
        grammar = self.grammars.get(r0)
        processors = None
        if grammar is not None:
            from xgrammar.contrib.hf import LogitsProcessor

            processors = [LogitsProcessor(grammar)]  # single use: one per generate call
        reused = [0] * len(reqs)
        with self._use(r0.adapter), torch.inference_mode():
            cache: dict[str, Any] = {}
            if self.prefixes is not None and any(r.session for r in reqs) and min(len(p) for p in prompts) > 1:
                cache["past_key_values"], reused = self._stacked_prefill(reqs, prompts)
            elif self.growing_kv:
                # Room for the whole decode: the buffers are allocated once, at the prompt's prefill.
                cache["past_key_values"] = growing_cache(self._kv_layers, spare=width)
            if r0.seed is not None:
                torch.manual_seed(r0.seed)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=gen,
                tokenizer=self.tokenizer if r0.stop else None,
                logits_processor=processors,
                **cache,
            )
        new = out.sequences[:, ids.shape[1] :].tolist()
        logps = None
        if r0.logprobs:
            # Raw model logprobs (before temperature/top-p), as vLLM reports them by default.
            logits = torch.stack(out.logits, dim=1).float()  # [rows, steps, vocab]
            logps = torch.log_softmax(logits, dim=-1).cpu()
        results = []
        for i, r in enumerate(reqs):
            comps = []
            for j in range(r.n):
                row = i * r.n + j
                tokens, reason = self._cut(new[row][: r.max_tokens], r.stop)
                text = truncate_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), r.stop)[0]
                lp = low = None
                if logps is not None:
                    values = [float(logps[row, s, tok]) for s, tok in enumerate(tokens)]
                    lp, low = float(sum(values)), (min(values) if values else None)
                comps.append(
                    Completion(
                        text=text,
                        num_tokens=len(tokens),
                        finish_reason=reason,
                        logprob=lp,
                        token_ids=list(tokens),
                        min_logprob=low,
                    )
                )
            results.append(GenerationResult(comps, len(prompts[i]), sum(c.num_tokens for c in comps), 0.0, reused[i]))
        return results

    def _drafted(self, reqs: list[GenerationRequest]) -> list[GenerationResult]:
        """Greedy requests of one adapter with a draft (base.py "Drafts"): each prompt and its draft run in one
        forward (from the session's cached prefix), which gives the model's greedy choice after the prompt and after
        each draft token. The draft's leading tokens that are those choices, and the choice after them, are the
        completion's first tokens, as greedy decoding would produce them; the requests not ended by then (no end of
        text, under max_tokens) decode the rest together from their prompt and those tokens, whose prefill the
        session's cache holds. A right draft costs one forward instead of a decode step per token."""
        torch = self.torch
        heads: list[tuple[list[int], list[float]]] = []  # per request: the tokens kept so far, their logprobs
        prompts, reused = [], []
        for r in reqs:
            p = prompt_ids(self.tokenizer, r)
            d = encode(self.tokenizer, r.draft or "")[: r.max_tokens]
            with self._use(r.adapter), torch.inference_mode():
                _, logits, k = self._prefill(r.session, r.adapter, p + d, keep=len(d) + 1)
            logps = torch.log_softmax(logits.float(), dim=-1).cpu()  # row i: the next token after p + d[:i]
            greedy = logps.argmax(-1).tolist()
            j = next((i for i, (g, t) in enumerate(zip(greedy, d)) if g != t), len(d))
            kept = (d[:j] + [greedy[j]])[: r.max_tokens]
            if self.eos_id in kept:
                kept = kept[: kept.index(self.eos_id) + 1]
            heads.append((kept, [float(logps[i, t]) for i, t in enumerate(kept)]))
            prompts.append(p)
            reused.append(min(k, len(p)))
        rest = [
            i
            for i, (kept, _) in enumerate(heads)
            if kept and kept[-1] != self.eos_id and len(kept) < reqs[i].max_tokens
        ]
        tails: dict[int, Completion] = {}
        if rest:
            more = [dataclasses.replace(reqs[i], max_tokens=reqs[i].max_tokens - len(heads[i][0])) for i in rest]
            done = self._generate_batch(more, [prompts[i] + heads[i][0] for i in rest])
            tails = {i: res.completions[0] for i, res in zip(rest, done)}
        results = []
        for i, r in enumerate(reqs):
            tokens, values = heads[i]
            low = min(values) if values else None
            if (tail := tails.get(i)) is not None:
                tokens = tokens + (tail.token_ids or [])
                if r.logprobs and tail.logprob is not None:
                    values = values + [tail.logprob]  # the tail's sum
                    low = tail.min_logprob if low is None or tail.min_logprob is None else min(low, tail.min_logprob)
            comp = Completion(
                text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                num_tokens=len(tokens),
                finish_reason="stop" if self.eos_id in tokens else "length",
                logprob=float(sum(values)) if r.logprobs else None,
                token_ids=list(tokens),
                min_logprob=low if r.logprobs else None,
            )
            results.append(GenerationResult([comp], len(prompts[i]), len(tokens), 0.0, reused[i]))
        return results

    # ------------------------------------------------------------------ prefix cache
    def _prefill(
        self, session: str | None, adapter: str | None, ids: list[int], keep: int = 0
    ) -> tuple[Any, Any, int]:
        """(KV cache of `ids`, the logits after each of its last `keep` tokens [keep, vocab] or None when `keep`
        is 0, tokens reused from the session's cache).

        Runs under the caller's adapter and inference mode. Only the tokens after the longest common prefix
        with the session's cached prompt run (at least the last `keep`); the result becomes the session's
        cached prompt for `adapter`."""
        from transformers import DynamicCache

        torch = self.torch
        prefix = self.prefixes.take(session, adapter) if self.prefixes is not None and session else None
        reuse = 0
        if prefix is not None:
            reuse = common_prefix(prefix.tokens, ids)
            if keep:
                reuse = min(reuse, len(ids) - keep)
        if reuse > 0:
            kv = prefix.kv
            crop(kv, reuse)
        elif self.growing_kv:
            kv = growing_cache(self._kv_layers, spare=self.kv_spare)
        else:
            kv = DynamicCache(config=self.config)
        logits = None
        if len(ids) > reuse:
            out = self.model(
                input_ids=torch.tensor([ids[reuse:]], device=self.device),
                past_key_values=kv,
                use_cache=True,
                logits_to_keep=max(keep, 1),
            )
            kv, logits = out.past_key_values, (out.logits[0, -keep:] if keep else None)
        if self.prefixes is not None and session:
            self._keep_prefix(session, adapter, ids, kv)
        return kv, logits, reuse

    def _keep_prefix(self, session: str, adapter: str | None, ids: list[int], kv: Any) -> None:
        """Make `kv` (the keys and values of `ids`) the session's cached prefix for `adapter`."""
        assert self.prefixes is not None
        for layer in kv.layers:
            if isinstance(layer, GrowingLayer):
                layer.trim(self.kv_spare)  # a prompt cropped short keeps no long prompt's buffer
        self.prefixes.put(session, adapter, Prefix(list(ids), kv))

    def _stacked_prefill(self, reqs: list[GenerationRequest], prompts: list[list[int]]) -> tuple[Any, list[int]]:
        """One batch cache for `generate`: every prompt prefilled alone (from its session's cached prefix, and
        cached whole for the session's next call), then all but its last token (which generate runs to get
        the first logits) left-padded to the batch's width as `_left_pad` pads the prompts (padding keys and
        values are zeros, masked by the attention mask), each row repeated n times as generate repeats the
        prompts for num_return_sequences. Returns (cache, tokens reused per request: at most all but one)."""
        from transformers import DynamicCache

        n = reqs[0].n
        width = max(len(p) for p in prompts) - 1
        # Growing: room for the decode (generate reruns each last prompt token, then max_tokens - 1 more).
        room = max(r.max_tokens for r in reqs) if self.growing_kv else 0
        batch: list[tuple[Any, Any]] = []  # per layer: (keys, values) [rows, heads, width + room, head_dim]
        reused = []
        for i, (r, p) in enumerate(zip(reqs, prompts)):
            kv, _, k = self._prefill(r.session, r.adapter, p)
            reused.append(min(k, len(p) - 1))
            if not batch:
                batch = [
                    tuple(t.new_zeros((len(reqs), t.shape[1], width + room, t.shape[3])) for t in (x.keys, x.values))
                    for x in kv.layers
                ]
            # Copied now: rows of one session share its cache object, which the next row's prefill crops and
            # extends (in place, for a growing cache).
            for (keys, values), layer in zip(batch, kv.layers):
                keys[i, :, width - (len(p) - 1) : width] = layer.keys[0, :, : len(p) - 1]
                values[i, :, width - (len(p) - 1) : width] = layer.values[0, :, : len(p) - 1]
        layers = [(keys.repeat_interleave(n, dim=0), values.repeat_interleave(n, dim=0)) for keys, values in batch]
        if self.growing_kv:
            return stacked_cache(layers, width, spare=self.kv_spare), reused
        return DynamicCache(ddp_cache_data=layers), reused

    def _cut(self, tokens: list[int], stop: Sequence[str]) -> tuple[list[int], str]:
        """Generated tokens up to EOS (included) or up to the token that completed a stop string."""
        if self.eos_id in tokens:
            tokens = tokens[: tokens.index(self.eos_id) + 1]
            end_reason = "stop"
        else:
            end_reason = "length"
        if stop:
            for k in range(1, len(tokens) + 1):
                if truncate_at_stop(self.tokenizer.decode(tokens[:k], skip_special_tokens=True), stop)[1]:
                    return tokens[:k], "stop"
        return tokens, end_reason

    def _choose(self, r: GenerationRequest) -> GenerationResult:
        """Exact constrained decoding over a choice list: score every choice, then argmax or sample."""
        torch = self.torch
        assert r.choices is not None
        (scored,) = self._score(
            [
                ScoreRequest(
                    candidates=r.choices, adapter=r.adapter, messages=r.messages, prompt=r.prompt, session=r.session
                )
            ]
        )
        lp = torch.tensor(scored.logprobs, dtype=torch.float64)
        picks = pick_choices(lp, r)
        comps = [
            Completion(
                text=r.choices[k],
                num_tokens=scored.num_tokens[k],
                finish_reason="stop",
                logprob=float(lp[k]) if r.logprobs else None,
            )
            for k in picks
        ]
        return GenerationResult(
            comps, scored.prompt_tokens, sum(c.num_tokens for c in comps), 0.0, scored.cached_tokens
        )

    # ------------------------------------------------------------------ score
    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        with timer() as t:
            results = self._score(requests)
        for r in results:
            r.seconds = t[0] / len(results)
        account(self.usage, results, t[0])
        return results

    def _score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        for r in requests:
            check_adapter(r.adapter, self.adapters, BACKEND)
        rows, lengths = score_rows(self.tokenizer, requests)
        values = [0.0] * len(rows)
        reused: dict[int, int] = {}  # request -> prompt tokens reused (its first trie chunk's prefill)
        by_adapter: dict[str | None, list[int]] = defaultdict(list)
        for k, row in enumerate(rows):
            by_adapter[requests[row.request].adapter].append(k)
        for adapter, idx in by_adapter.items():
            with self._use(adapter):
                if self.shared_prefix_scoring:
                    by_request: dict[int, list[int]] = defaultdict(list)
                    for k in idx:
                        by_request[rows[k].request].append(k)
                    for i, ks in by_request.items():
                        for s in range(0, len(ks), TRIE_CANDIDATES):
                            chunk = ks[s : s + TRIE_CANDIDATES]
                            logprobs, k0 = self._shared_prefix_logprobs(
                                [rows[k] for k in chunk], requests[i].session, adapter
                            )
                            reused.setdefault(i, k0)
                            for k, v in zip(chunk, logprobs):
                                values[k] = v
                    continue
                idx.sort(key=lambda k: len(rows[k].ids))  # similar lengths together: less padding
                for s in range(0, len(idx), self.batch_size):
                    chunk = idx[s : s + self.batch_size]
                    for k, v in zip(chunk, self._row_logprobs([rows[k] for k in chunk])):
                        values[k] = v
        results = score_results(requests, rows, values, lengths, 0.0)
        for i, k in reused.items():
            results[i].cached_tokens = k
        return results

    def _shared_prefix_logprobs(
        self, rows: list[ScoreRow], session: str | None = None, adapter: str | None = None
    ) -> tuple[list[float], int]:
        """Like `_row_logprobs` for rows that share one prompt: the prompt runs once, then every
        candidate's tokens run together as one token tree (a trie: a prefix shared by several candidates,
        like `put key in`, is computed once) in a single forward pass over the prompt's KV cache, each
        token attending to the prompt and its own ancestors only.

        Scoring K valid actions after a ~600-token prompt then costs one prompt pass plus the trie's few
        dozen tokens instead of K x 600: the planner's main cost on the CPU. The prompt pass prefills from
        the session's cached prefix (`_prefill`, under the caller's adapter); returns (logprobs, tokens reused).
        """
        torch = self.torch
        start = rows[0].start
        prompt = rows[0].ids[:start]
        assert all(r.start == start and r.ids[:start] == prompt for r in rows), "rows must share their prompt"
        tokens, parents, paths = token_trie([r.ids[start:] for r in rows])
        n = len(tokens)
        depth, allowed = trie_attention(parents, start)
        dev = self.device
        dtype = self.model.dtype
        mask = torch.zeros(1, 1, n, start + n, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)  # additive: right for sdpa and eager attention
        # The LM head runs only where a child is predicted: a leaf's logits score nothing (a third of the
        # nodes or more when the candidates are short actions).
        inner = inner_nodes(parents)
        # One candidate is a chain, not a tree: its keys and values are the prompt's continuation (the simulator's
        # scored observation is how its next prompt goes on), so the session keeps them instead of dropping them.
        chain = len(rows) == 1 and self.prefixes is not None and bool(session)
        with torch.inference_mode():
            kv, last, reused = self._prefill(session, adapter, prompt, keep=1)
            kept = False
            try:
                logits = self.model(
                    input_ids=torch.tensor([tokens], device=dev),
                    attention_mask=mask.to(dev),
                    position_ids=torch.tensor([[start + d for d in depth]], device=dev),
                    past_key_values=kv,
                    logits_to_keep=torch.tensor(inner or [0], device=dev),
                ).logits.float()
                if chain:
                    self._keep_prefix(session, adapter, prompt + tokens, kv)
                    kept = True
            finally:
                if not kept:
                    crop(kv, start)  # the trie's tokens off again: the cache may be the session's prefix
        # The prompt's last position predicts each first token; trie node i predicts its children.
        first = torch.log_softmax(last[0].float(), dim=-1).cpu()
        logps = torch.log_softmax(logits[0], dim=-1).cpu()
        result = path_logprobs(tokens, paths, first, logps, rows={node: i for i, node in enumerate(inner)})
        return result, reused

    def _row_logprobs(self, rows: list[ScoreRow]) -> list[float]:
        """Sum of logprobs of ids[start:] per row, in one forward pass over the left-padded batch."""
        torch = self.torch
        ids, mask = self._left_pad([r.ids for r in rows])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding must not shift positions
        tail = max(len(r.ids) - r.start for r in rows)
        with torch.inference_mode():
            # Only the last `tail + 1` positions predict candidate tokens; skipping the LM head over the
            # prompt saves most of the (49k-word) vocabulary projection.
            logits = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=tail + 1
            ).logits.float()
        logps = torch.log_softmax(logits[:, :-1], dim=-1)  # position p predicts token p+1
        targets = ids[:, -tail:]
        picked = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1).cpu()  # [rows, tail]
        out = []
        for i, r in enumerate(rows):
            n = len(r.ids) - r.start
            out.append(float(picked[i, tail - n :].sum()))
        return out

    # ------------------------------------------------------------------ embed
    def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        """Each text's mean last hidden state over its tokens (no chat template), L2-normalised; batches of
        `batch_size`, per adapter (None: the base model)."""
        torch = self.torch
        for r in requests:
            check_adapter(r.adapter, self.adapters, BACKEND)
        results: list[EmbedResult | None] = [None] * len(requests)
        with timer() as t:
            order = sorted(range(len(requests)), key=lambda i: (str(requests[i].adapter), len(requests[i].text)))
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                groups: dict[str | None, list[int]] = {}
                for i in idx:
                    groups.setdefault(requests[i].adapter, []).append(i)
                for adapter, members in groups.items():
                    encoded = [encode(self.tokenizer, requests[i].text) for i in members]
                    rows = [e or [self.pad_id] for e in encoded]
                    width = max(map(len, rows))
                    ids = torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows], device=self.device)
                    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.device)
                    with self._use(adapter), torch.inference_mode():
                        out = self.model(
                            input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1
                        )
                    hidden = out.hidden_states[-1].float() * mask.unsqueeze(-1)
                    pooled = hidden.sum(1) / mask.sum(1, keepdim=True)
                    pooled = torch.nn.functional.normalize(pooled, dim=-1)
                    for e, i, vec in zip(encoded, members, pooled.tolist()):
                        results[i] = EmbedResult(vec if e else [0.0] * len(vec), len(e), 0.0)
        done = [r for r in results if r is not None]
        for r in done:
            r.seconds = t[0] / max(len(done), 1)
        account(self.usage, done, t[0])  # type: ignore[arg-type]
        return done

    def close(self) -> None:
        if self.prefixes is not None:
            self.prefixes.clear()
        self.model = None

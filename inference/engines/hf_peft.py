"""transformers + peft backend: one base model with every LoRA adapter loaded, for machines without vLLM.

    from simplan.inference.engines import make_engine
    engine = make_engine("hf", "smollm2-135m-instruct", {"decider": "runs/decider", "simulator": "runs/sim"})
    engine.generate([GenerationRequest(adapter="decider", messages=msgs)])

Requests are grouped by adapter (and sampling settings); each group runs as left-padded batched
`generate` calls with that adapter active (`set_adapter`), base-model requests under
`disable_adapter()`. Constrained decoding supports `choices` exactly (every choice is scored with
the model and the best one taken, or n are sampled from the choices' distribution); `regex` and
`json_schema` go through xgrammar (the grammar engine vLLM uses, installed with it) as a logits
processor, compiled once per pattern; JSON is generated compact (no free whitespace). Without
xgrammar they raise NotImplementedError naming what to install.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from simplan.inference.engine import (
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
    score_results,
    score_rows,
    timer,
    truncate_at_stop,
)

BACKEND = "hf"
TRIE_CANDIDATES = 256  # candidates scored in one token tree over a shared prompt (bounds its logits' memory)


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
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from simplan.training.models import load_tokenizer, pick_device, resolve_model

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
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.device = pick_device(device)
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
        self._grammars: dict[tuple[str, str], Any] = {}  # (kind, pattern) -> xgrammar CompiledGrammar
        self._grammar_compiler: Any = None
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id

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
            self._grammar(r)  # compile (or refuse) before any work
        results: list[GenerationResult | None] = [None] * len(requests)
        with timer() as t:
            free: dict[tuple, list[int]] = defaultdict(list)
            for i, r in enumerate(requests):
                if r.choices is not None:
                    results[i] = self._choose(r)
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
                        _grammar_key(r),
                    )
                    free[key].append(i)
            for idx in free.values():
                step = max(1, self.batch_size // requests[idx[0]].n)  # batch_size counts rows (prompts x n)
                for k in range(0, len(idx), step):
                    chunk = idx[k : k + step]
                    for i, res in zip(chunk, self._generate_batch([requests[i] for i in chunk])):
                        results[i] = res
        out = [r for r in results if r is not None]
        for r in out:
            r.seconds = t[0] / len(out)
        account(self.usage, out, t[0])
        return out

    def _grammar(self, r: GenerationRequest) -> Any:
        """The compiled xgrammar grammar of a regex / json_schema request (cached), or None."""
        key = _grammar_key(r)
        if key is None:
            return None
        if key not in self._grammars:
            try:
                import xgrammar as xgr
            except ImportError as e:
                raise NotImplementedError(
                    f"{BACKEND} backend: constrained decoding by {key[0]} needs xgrammar (pip install xgrammar, or "
                    "install vllm, which brings it); or use choices=, or the vllm / openai backend"
                ) from e
            if self._grammar_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=[self.eos_id]
                )
                self._grammar_compiler = xgr.GrammarCompiler(info)
            kind, pattern = key
            if kind == "regex":
                self._grammars[key] = self._grammar_compiler.compile_regex(pattern)
            else:
                self._grammars[key] = self._grammar_compiler.compile_json_schema(pattern, any_whitespace=False)
        return self._grammars[key]

    def _left_pad(self, rows: Sequence[list[int]]) -> tuple[Any, Any]:
        width = max(len(r) for r in rows)
        ids = self.torch.full((len(rows), width), self.pad_id, dtype=self.torch.long)
        mask = self.torch.zeros((len(rows), width), dtype=self.torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = self.torch.tensor(r, dtype=self.torch.long)
            mask[i, width - len(r) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _generate_batch(self, reqs: list[GenerationRequest]) -> list[GenerationResult]:
        """Same adapter and sampling settings: one left-padded `generate` call."""
        from transformers import GenerationConfig

        torch = self.torch
        r0 = reqs[0]
        prompts = [prompt_ids(self.tokenizer, r) for r in reqs]
        ids, mask = self._left_pad(prompts)
        sample = r0.temperature > 0
        gen = GenerationConfig(
            max_new_tokens=r0.max_tokens,
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
        if r0.seed is not None:
            torch.manual_seed(r0.seed)
        grammar = self._grammar(r0)
        processors = None
        if grammar is not None:
            from xgrammar.contrib.hf import LogitsProcessor

            processors = [LogitsProcessor(grammar)]  # single use: one per generate call
        with self._use(r0.adapter), torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=gen,
                tokenizer=self.tokenizer if r0.stop else None,
                logits_processor=processors,
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
                tokens, reason = self._cut(new[row], r.stop)
                text = truncate_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), r.stop)[0]
                lp = None
                if logps is not None:
                    lp = float(sum(logps[row, s, tok] for s, tok in enumerate(tokens)))
                comps.append(
                    Completion(
                        text=text, num_tokens=len(tokens), finish_reason=reason, logprob=lp, token_ids=list(tokens)
                    )
                )
            results.append(GenerationResult(comps, len(prompts[i]), sum(c.num_tokens for c in comps), 0.0))
        return results

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
            [ScoreRequest(candidates=r.choices, adapter=r.adapter, messages=r.messages, prompt=r.prompt)]
        )
        lp = torch.tensor(scored.logprobs, dtype=torch.float64)
        if r.temperature <= 0:
            picks = [int(lp.argmax())] * r.n
        else:
            probs = torch.softmax(lp / r.temperature, dim=0)
            if r.top_p < 1.0:
                order = torch.argsort(probs, descending=True)
                cum = torch.cumsum(probs[order], 0)
                drop = order[(cum - probs[order]) >= r.top_p]  # keep the smallest set reaching top_p
                probs[drop] = 0.0
                probs /= probs.sum()
            gen = torch.Generator().manual_seed(r.seed) if r.seed is not None else None
            picks = torch.multinomial(probs, r.n, replacement=True, generator=gen).tolist()
        comps = [
            Completion(
                text=r.choices[k],
                num_tokens=scored.num_tokens[k],
                finish_reason="stop",
                logprob=float(lp[k]) if r.logprobs else None,
            )
            for k in picks
        ]
        return GenerationResult(comps, scored.prompt_tokens, sum(c.num_tokens for c in comps), 0.0)

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
        by_adapter: dict[str | None, list[int]] = defaultdict(list)
        for k, row in enumerate(rows):
            by_adapter[requests[row.request].adapter].append(k)
        for adapter, idx in by_adapter.items():
            with self._use(adapter):
                if self.shared_prefix_scoring:
                    by_request: dict[int, list[int]] = defaultdict(list)
                    for k in idx:
                        by_request[rows[k].request].append(k)
                    for ks in by_request.values():
                        for s in range(0, len(ks), TRIE_CANDIDATES):
                            chunk = ks[s : s + TRIE_CANDIDATES]
                            for k, v in zip(chunk, self._shared_prefix_logprobs([rows[k] for k in chunk])):
                                values[k] = v
                    continue
                idx.sort(key=lambda k: len(rows[k].ids))  # similar lengths together: less padding
                for s in range(0, len(idx), self.batch_size):
                    chunk = idx[s : s + self.batch_size]
                    for k, v in zip(chunk, self._row_logprobs([rows[k] for k in chunk])):
                        values[k] = v
        return score_results(requests, rows, values, lengths, 0.0)

    def _shared_prefix_logprobs(self, rows: list[ScoreRow]) -> list[float]:
        """Like `_row_logprobs` for rows that share one prompt: the prompt runs once, then every
        candidate's tokens run together as one token tree (a trie: a prefix shared by several candidates,
        like `put key in`, is computed once) in a single forward pass over the prompt's KV cache, each
        token attending to the prompt and its own ancestors only.

        Scoring K valid actions after a ~600-token prompt then costs one prompt pass plus the trie's few
        dozen tokens instead of K x 600: the planner's main cost on the CPU.
        """
        torch = self.torch
        start = rows[0].start
        prompt = rows[0].ids[:start]
        assert all(r.start == start and r.ids[:start] == prompt for r in rows), "rows must share their prompt"
        tokens, parents, paths = _token_trie([r.ids[start:] for r in rows])
        n = len(tokens)
        depth = [0] * n
        allowed = torch.zeros(n, start + n, dtype=torch.bool)
        allowed[:, :start] = True
        for i, parent in enumerate(parents):  # parents come before their children
            if parent >= 0:
                depth[i] = depth[parent] + 1
                allowed[i, start : start + n] = allowed[parent, start : start + n]
            allowed[i, start + i] = True
        dev = self.device
        dtype = self.model.dtype
        mask = torch.zeros(1, 1, n, start + n, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)  # additive: right for sdpa and eager attention
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([prompt], device=dev), use_cache=True, logits_to_keep=1)
            logits = self.model(
                input_ids=torch.tensor([tokens], device=dev),
                attention_mask=mask.to(dev),
                position_ids=torch.tensor([[start + d for d in depth]], device=dev),
                past_key_values=out.past_key_values,
            ).logits.float()
        # The prompt's last position predicts each first token; trie node i predicts its children.
        first = torch.log_softmax(out.logits[0, -1].float(), dim=-1).cpu()
        logps = torch.log_softmax(logits[0], dim=-1).cpu()
        result = []
        for path in paths:
            total = first[tokens[path[0]]]
            for parent, child in zip(path, path[1:]):
                total = total + logps[parent, tokens[child]]
            result.append(float(total))
        return result

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

    def close(self) -> None:
        self.model = None


def _grammar_key(r: GenerationRequest) -> tuple[str, str] | None:
    if r.regex is not None:
        return ("regex", r.regex)
    if r.json_schema is not None:
        return ("json", json.dumps(r.json_schema, sort_keys=True))
    return None


def _token_trie(tails: list[list[int]]) -> tuple[list[int], list[int], list[list[int]]]:
    """The candidates' token sequences as a trie: (token per node, parent node or -1, each tail's node path).

    Nodes are numbered in insertion order, so a parent always precedes its children."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    for tail in tails:
        node, path = -1, []
        for token in tail:
            key = (node, token)
            if key not in children:
                children[key] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = children[key]
            path.append(node)
        paths.append(path)
    return tokens, parents, paths

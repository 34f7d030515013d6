"""Which weights dtype is fastest on this CPU: a prefill and a decode step of the model in each dtype, side by side.

    flock /tmp/heavy.lock .venv/bin/python bench/bench_dtype.py [--model smollm2-135m-instruct] [--rows 4 --tokens 300]

On CPUs without native bf16 (no AVX512-BF16 / AMX flag) torch emulates bfloat16 and a prefill is several times
slower than in float32; on a Xeon with AMX bf16 is the faster one. `dtype: auto` follows the flag (models/registry.py
`resolve_dtype`); this measures what the flag predicts. Prints one Markdown row per dtype and the CPU's flag.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from simplan.core.cpu import native_bf16
    from simplan.models.registry import resolve_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    ids = torch.randint(0, 32000, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0))
    print(f"native bf16 (AVX512-BF16 or AMX): {native_bf16()}; {args.threads} threads")
    print(
        f"| dtype | prefill {args.rows} x {args.tokens} (ms) | decode step, {args.rows} rows (ms) |\n|---|---:|---:|"
    )
    for name in args.dtypes.split(","):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, name)).eval()
        with torch.inference_mode():
            model(ids, logits_to_keep=1)  # warm-up
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                out = model(ids, use_cache=True, logits_to_keep=1)
            prefill = (time.perf_counter() - t0) / args.repeats
            cache, step = out.past_key_values, ids[:, -1:]
            t0 = time.perf_counter()
            for _ in range(10):
                cache = model(step, past_key_values=cache, use_cache=True).past_key_values
            decode = (time.perf_counter() - t0) / 10
        print(f"| {name} | {prefill * 1000:.0f} | {decode * 1000:.1f} |", flush=True)


if __name__ == "__main__":
    main()

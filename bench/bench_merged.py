"""Merged adapters vs multi-LoRA on the hf and vLLM backends: generate and score throughput, side by side.

    .venv/bin/python bench/bench_merged.py                                      # SmolLM2 + random rank-16 adapters
    .venv/bin/python bench/bench_merged.py --adapters decider=runs/d/adapter,simulator=runs/s/adapter
    .venv/bin/python bench/bench_merged.py --configs hf-lora,hf-merged --out bench/merged.json
    .venv/bin/python bench/bench_merged.py --model DIR --episodes 2 --rounds 1 --max-tokens 4 --enforce-eager  # smoke

Workload (TWX-like conversations rendered by data/episode.py, as the planner renders them): `--episodes`
episodes advance together, one step per round; each round is one `generate` call holding, per
episode, a decider request (the conversation so far, greedy) and a simulator request (the mirrored
conversation, greedy), `--max-tokens` new tokens each, then one `score` call ranking the episode's
valid actions with the decider. Consecutive rounds share each episode's prompt prefix, as a real
evaluation does, so vLLM's prefix cache counts. Round 0 is a warm-up (first LoRA load, kernels) and
is not timed. Configs run one after another in this process; each is closed before the next starts.

Columns: startup_s (engine build; for merged configs merge_s is the one-time merge, cached after),
gen_tok_per_s (generated tokens / generate seconds), prompt_tok_per_s, score_rows_per_s, and for
vLLM the prefix-cache hit rate of the timed generate calls (cached prompt tokens / prompt tokens;
vLLM's CPU cache holds whole 128-token blocks, and scoring rows never read it: prompt_logprobs).
Without --adapters, random rank-16 LoRA adapters on all linear layers (seeded, so their merged copies
are reused across runs) are made in a temp folder: the same cost as trained ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_engines import random_adapters  # this folder is on sys.path when a bench script runs

CONFIGS = ("hf-lora", "hf-merged", "vllm-lora", "vllm-merged")
GOAL = "Your task is to find the brass key, unlock the wooden chest in the attic and put the map inside it."
ROOMS = ["kitchen", "hallway", "pantry", "living room", "staircase", "attic", "cellar", "garden"]
THINGS = ["a fridge", "a wooden table", "a red apple", "a candle", "an old map", "a rusty knife", "a brass key"]
VERBS = ["go north", "go south", "go east", "go west", "open door", "take {t}", "examine {t}", "look", "inventory"]


def observation(episode: int, step: int) -> str:
    """A TWX-like room description (~60-90 tokens), different per episode and step."""
    room = ROOMS[(episode + step) % len(ROOMS)]
    seen = [THINGS[(episode * 3 + step + k) % len(THINGS)] for k in range(3)]
    return (
        f"-= {room.title()} =-\nYou arrive in the {room}. It is a room that smells of dust and old wood. "
        f"You can see {seen[0]}, {seen[1]} and {seen[2]} here. "
        f"There is an exit to the north and a closed door to the east. Step {step} of your search."
    )


def valid_actions(episode: int, step: int) -> list[str]:
    thing = THINGS[(episode + step) % len(THINGS)].split(" ", 1)[1]
    return [v.format(t=thing) for v in VERBS]


def episode_state(episode: int, steps: int):
    """An EpisodeState after `steps` steps of episode `episode`, its last turn open."""
    from simplan.data.episode import EpisodeState

    state = EpisodeState.start(GOAL, observation(episode, 0), valid_actions=valid_actions(episode, 0))
    for t in range(steps):
        action = valid_actions(episode, t)[(episode + t) % len(VERBS)]
        state.step(action, observation(episode, t + 1), valid_actions=valid_actions(episode, t + 1))
    return state


def round_requests(renderer, episodes: int, step: int, max_tokens: int):
    """Step `step` of every episode: decider + simulator generate requests, and a decider score request."""
    from simplan.inference.engines.base import GenerationRequest, ScoreRequest

    gen, score = [], []
    for e in range(episodes):
        state = episode_state(e, step)
        valid = valid_actions(e, step)
        decider = renderer.decider_messages(state)
        simulator = renderer.simulator_messages(state, valid[0])
        gen.append(GenerationRequest(adapter="decider", messages=decider, max_tokens=max_tokens, tag="decide"))
        gen.append(GenerationRequest(adapter="simulator", messages=simulator, max_tokens=max_tokens, tag="simulate"))
        score.append(ScoreRequest(candidates=valid, adapter="decider", messages=decider, tag="score"))
    return gen, score


def build(config: str, model_path: str, adapters: dict[str, str], args) -> tuple[object, float]:
    """The engine of `config` and its one-time merge seconds (0 for multi-LoRA)."""
    from simplan.inference.engines import make_engine
    from simplan.inference.engines.merged import merged_model

    kind, mode = config.split("-")
    merge_s = 0.0
    if mode == "merged":
        t0 = time.perf_counter()
        for path in adapters.values():
            merged_model(model_path, path)  # cached: only the first run of these adapters merges
        merge_s = time.perf_counter() - t0
    opts: dict = {"dtype": args.dtype, "threads": args.threads, "merge_adapters": mode == "merged"}
    if kind == "vllm":
        opts.update(enforce_eager=args.enforce_eager, kv_cache_gib=args.kv_cache_gib, max_model_len=2048)
    return make_engine(kind, model_path, adapters, **opts), merge_s


def cache_totals(engine) -> tuple[int, int]:
    """(prompt tokens, cached prompt tokens) so far over a vLLM engine's models; (0, 0) for hf."""
    read = getattr(engine, "prefix_cache_stats", None)
    if read is None:
        return 0, 0
    stats = read()  # VLLMEngine: one dict of counts; MergedEngine: one per model ({} over hf models)
    parts = [stats] if "prompt_tokens" in stats else list(stats.values())
    return sum(int(s["prompt_tokens"]) for s in parts), sum(int(s["cached_tokens"]) for s in parts)


def run_config(engine, renderer, args) -> dict:
    gen0, score0 = round_requests(renderer, args.episodes, args.first_step, args.max_tokens)
    engine.generate(gen0)  # warm-up
    engine.score(score0)
    prompt0, cached0 = cache_totals(engine)
    gen_s = score_s = 0.0
    prompt = generated = rows = 0
    for step in range(1, args.rounds + 1):
        gen, score = round_requests(renderer, args.episodes, args.first_step + step, args.max_tokens)
        t0 = time.perf_counter()
        results = engine.generate(gen)
        gen_s += time.perf_counter() - t0
        prompt += sum(r.prompt_tokens for r in results)
        generated += sum(r.completion_tokens for r in results)
        t0 = time.perf_counter()
        engine.score(score)
        score_s += time.perf_counter() - t0
        rows += sum(len(r.candidates) for r in score)
    prompt1, cached1 = cache_totals(engine)
    sent = prompt1 - prompt0
    requests = 2 * args.episodes * args.rounds
    return {
        "requests": requests,
        "prompt_tokens_avg": round(prompt / requests),
        "generated_tokens": generated,
        "generate_s": round(gen_s, 2),
        "gen_tok_per_s": round(generated / gen_s, 1),
        "prompt_tok_per_s": round(prompt / gen_s, 1),
        "score_rows": rows,
        "score_s": round(score_s, 2),
        "score_rows_per_s": round(rows / score_s, 1),
        "prefix_hit_rate": round((cached1 - cached0) / sent, 3) if sent else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--adapters", default="", help="name=DIR,... (decider and simulator); default: random adapters")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    p.add_argument("--dtype", default="auto", help="weights dtype (auto, as the eval recipes use)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--episodes", type=int, default=8, help="episodes per round (2 generate requests each)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (steps), after one warm-up round")
    p.add_argument("--first-step", type=int, default=1, help="steps before round 0 (1: timed prompts ~370 tokens)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--budget", type=int, default=1024, help="conversation window budget in tokens")
    p.add_argument("--kv-cache-gib", type=int, default=2, help="vLLM: KV cache per engine (merged: per model)")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start)")
    p.add_argument("--out", default="", help="write the rows as JSON here")
    args = p.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs: unknown {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")

    from simplan.core.io import write_json
    from simplan.data.episode import PromptSettings, renderer_for
    from simplan.inference.engines import parse_adapters
    from simplan.models.registry import load_tokenizer, resolve_model

    model_path = resolve_model(args.model)
    tmp = tempfile.TemporaryDirectory(prefix="bench-merged-")
    adapters = parse_adapters(args.adapters) or random_adapters(model_path, Path(tmp.name))
    renderer = renderer_for(PromptSettings(budget=args.budget), load_tokenizer(model_path))
    rows = []
    for config in configs:
        print(f"bench: {config} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        engine, merge_s = build(config, model_path, adapters, args)
        startup = time.perf_counter() - t0 - merge_s
        try:
            row = run_config(engine, renderer, args)
        finally:
            engine.close()
        rows.append({"config": config, "startup_s": round(startup, 1), "merge_s": round(merge_s, 1), **row})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cols = ["config", "startup_s", "merge_s", "requests", "prompt_tokens_avg", "generated_tokens"]
    cols += ["gen_tok_per_s", "prompt_tok_per_s", "score_rows_per_s", "prefix_hit_rate"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    meta.update(cpu_count=os.cpu_count(), load=os.getloadavg(), adapters="given" if args.adapters else "random r16")
    if args.out:
        write_json(args.out, {"config": meta, "rows": rows})
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Merged adapters (inference/engines/merged.py) on a tiny random float32 model with two random LoRA adapters.

    .venv/bin/pytest -q tests/test_merged.py                 # hf (seconds); the vLLM test is slow-marked
    .venv/bin/pytest -q tests/test_merged.py -m "not slow"

The multi-LoRA hf engine is the reference: the merged engine must give the same greedy tokens for the
base model and both adapters (exactly: float32 and unscaled logits keep W + BA vs W and BA apart by
~1e-6, far below the gap between top tokens) and scores within 1e-4.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from simplan.inference.engines import make_engine
from simplan.inference.engines.base import Engine, GenerationRequest, ScoreRequest
from simplan.inference.engines.merged import MANIFEST, MergedEngine, merged_folder, merged_model

HAS_VLLM = importlib.util.find_spec("vllm") is not None
ROLES = (None, "decider", "simulator")
PROMPTS = [
    [{"role": "user", "content": "Goal: find the key.\n\nCurrent observation:\nYou are in a hall.\n\nNext action?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Observation after go north?"}],
]
CHOICES = ["go north", "open door", "take key", "look"]
SETTINGS = {"format": "conversation", "budget": 640}


def make_adapter(base: str, out: Path, seed: int, settings: dict | None = None) -> str:
    """A rank-8 LoRA on every projection with random non-zero B (peft starts B at zero: adapter == base)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    peft_model.save_pretrained(out)
    if settings is not None:
        (out / "prompt_settings.json").write_text(json.dumps(settings))
    return str(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, dict[str, str]]:
    from simplan.models.tiny import tiny_model

    base = str(tiny_model("llama", final_norm=1.0))
    root = tmp_path_factory.mktemp("adapters")
    adapters = {
        "decider": make_adapter(base, root / "decider", seed=1, settings=SETTINGS),
        "simulator": make_adapter(base, root / "simulator", seed=2),
    }
    return base, adapters


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("merged")


@pytest.fixture(scope="module")
def lora(tiny):
    base, adapters = tiny
    engine = make_engine("hf", base, adapters, dtype="float32", threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def merged(tiny, cache):
    base, adapters = tiny
    engine = MergedEngine("hf", base, adapters, cache=cache, dtype="float32", threads=1)
    yield engine
    engine.close()


def _greedy(max_tokens: int = 12) -> list[GenerationRequest]:
    """Base and both adapters on every prompt, interleaved in one mixed batch."""
    return [GenerationRequest(adapter=a, messages=m, max_tokens=max_tokens) for m in PROMPTS for a in ROLES]


def _tokens(results) -> list[list[int]]:
    return [r.completions[0].token_ids for r in results]


def test_merged_hf_gives_the_multi_lora_greedy_tokens(lora, merged):
    reqs = _greedy()
    want, got = lora.generate(reqs), merged.generate(reqs)
    assert _tokens(got) == _tokens(want)
    assert [r.prompt_tokens for r in got] == [r.prompt_tokens for r in want]
    base, dec, sim = (tuple(t) for t in _tokens(want)[:3])
    assert len({base, dec, sim}) == 3, "the adapters must change the output, or the comparison proves nothing"


def test_merged_hf_scores_match_multi_lora(lora, merged):
    reqs = [ScoreRequest(candidates=CHOICES, adapter=a, messages=m) for m in PROMPTS for a in ROLES]
    for want, got in zip(lora.score(reqs), merged.score(reqs)):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert got.num_tokens == want.num_tokens and got.prompt_tokens == want.prompt_tokens


def test_merged_engine_routes_by_adapter_and_counts_each_call_once(merged):
    assert isinstance(merged, Engine) and merged.adapters == ["decider", "simulator"]
    calls = merged.usage.calls
    results = merged.generate(_greedy(max_tokens=4))
    assert merged.usage.calls == calls + 1 and merged.usage.requests >= len(results)
    assert set(merged.engines) == {None, "decider", "simulator"}  # the base engine was built by its first request
    assert merged.engines["decider"].adapters == []  # plain models: no LoRA anywhere
    with pytest.raises(KeyError, match="planner"):
        merged.generate([GenerationRequest(adapter="planner", messages=PROMPTS[0])])


def test_merged_hf_keeps_each_sessions_prefix_and_frees_it(merged):
    from simplan.inference.engines.base import MeteredEngine, SessionEngine

    assert isinstance(merged, SessionEngine)  # MeteredEngine forwards end_session only to SessionEngines
    meter = MeteredEngine(merged, session="episode-1")
    later = PROMPTS[0] + [{"role": "assistant", "content": "go north"}, {"role": "user", "content": "A dark room."}]
    for adapter in ("decider", "simulator"):
        meter.generate([GenerationRequest(adapter=adapter, messages=PROMPTS[0], max_tokens=2)])
    (warm,) = meter.generate([GenerationRequest(adapter="decider", messages=later, max_tokens=2)])
    assert warm.cached_tokens > 0  # the decider's merged model reused the session's first prompt
    meter.end_session()
    (cold,) = meter.generate([GenerationRequest(adapter="simulator", messages=later, max_tokens=2)])
    assert cold.cached_tokens == 0  # freed in the simulator's sub-engine too


def test_merged_folder_is_cached_keyed_by_content_and_keeps_prompt_settings(tiny, cache, tmp_path, monkeypatch):
    import peft

    base, adapters = tiny
    first = merged_model(base, adapters["decider"], cache)
    assert (first / MANIFEST).exists() and (first / "config.json").exists()
    assert (first / "tokenizer_config.json").exists()
    assert json.loads((first / "prompt_settings.json").read_text()) == SETTINGS
    assert not (merged_model(base, adapters["simulator"], cache) / "prompt_settings.json").exists()

    def no_merge(*args, **kwargs):
        raise AssertionError("merged again although the folder is cached")

    monkeypatch.setattr(peft.PeftModel, "from_pretrained", no_merge)
    assert merged_model(base, adapters["decider"], cache) == first
    # Another adapter's content (here: a retrained copy) gets its own folder.
    other = make_adapter(base, tmp_path / "decider", seed=9)
    assert merged_folder(base, other, cache) != first


def test_make_engine_merges_and_keeps_the_original_adapter_dirs(tiny, tmp_path, monkeypatch):
    from simplan.inference.engines.config import EngineConfig

    base, adapters = tiny
    monkeypatch.setenv("SIMPLAN_CACHE", str(tmp_path))
    monkeypatch.delenv("SIMPLAN_MERGE_CACHE")  # conftest's session merge cache: here the default root is tested
    engine = make_engine("hf", base, adapters, dtype="float32", threads=1, merge_adapters=True)
    try:
        assert isinstance(engine, MergedEngine)
        assert engine.adapter_dirs == adapters  # prompt settings are read from the adapters themselves
        assert all(Path(p).is_relative_to(tmp_path / "merged") for a, p in engine.model_paths.items() if a)
    finally:
        engine.close()
    with pytest.raises(ValueError, match="merge_adapters"):
        EngineConfig(engine="openai", merge_adapters=True)
    with pytest.raises(TypeError, match="merge_adapters"):
        make_engine("openai", base, ["decider"], merge_adapters=True)


@pytest.mark.slow
@pytest.mark.vllm
def test_merged_vllm_matches_merged_hf_and_reports_prefix_hits(tiny, cache, merged):
    """Three in-process vllm.LLM instances (base + two merged models) in one process, on the CPU."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    base, adapters = tiny
    opts = dict(dtype="float32", kv_cache_gib=1, threads=2, enforce_eager=True, max_model_len=1024)
    engine = MergedEngine("vllm", base, adapters, cache=cache, **opts)
    try:
        reqs = _greedy(max_tokens=16)
        assert _tokens(engine.generate(reqs)) == _tokens(merged.generate(reqs))
        sreq = [ScoreRequest(candidates=CHOICES, adapter=a, messages=PROMPTS[0]) for a in ROLES]
        for want, got in zip(merged.score(sreq), engine.score(sreq)):
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-3)
        # vLLM CPU caches whole 128-token blocks: a long prompt, sent twice, hits on the second time.
        long = [{"role": "user", "content": "You are in a hall. " * 60 + "Next action?"}]
        for _ in range(2):
            engine.generate([GenerationRequest(adapter=a, messages=long, max_tokens=2) for a in ROLES])
        stats = engine.prefix_cache_stats()
        assert set(stats) == {"base", "decider", "simulator"}
        assert all(s["cached_tokens"] > 0 and 0 < s["hit_rate"] <= 1 for s in stats.values())
    finally:
        engine.close()

"""The growing KV cache (inference/engines/kv_cache.py) against transformers' DynamicLayer, and the hf engine with
it against the engine with plain DynamicCaches.

    .venv/bin/pytest -q tests/test_kv_cache.py

The layer tests run the same sequence of operations (updates, crops, repeats, selects, reorders, resets, offload)
on a DynamicLayer and a GrowingLayer with a small spare, so buffers fill, grow and get rebound, and require
torch.equal keys and values and equal lengths after every step. The engine tests run each request set twice on
one engine (growing_kv on, then off, with fresh prefix caches) and require identical token ids and logprobs.
"""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from simplan.inference.engines import make_engine
from simplan.inference.engines.base import GenerationRequest, ScoreRequest
from simplan.inference.engines.hf_peft import HFPeftEngine
from simplan.inference.engines.kv_cache import GrowingLayer, growing_cache, stacked_cache

B, H, D = 3, 2, 4


def states(n: int, batch: int = B, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, H, n, D, generator=g), torch.randn(batch, H, n, D + 1, generator=g)


def same(ref: DynamicLayer, got: GrowingLayer) -> None:
    assert got.get_seq_length() == ref.get_seq_length()
    assert got.get_mask_sizes(2) == ref.get_mask_sizes(2)
    if ref.get_seq_length():
        assert torch.equal(got.keys, ref.keys) and torch.equal(got.values, ref.values)


def both(ref: DynamicLayer, got: GrowingLayer, op: str, *args) -> None:
    a, b = getattr(ref, op)(*args), getattr(got, op)(*args)
    if op == "update":
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    same(ref, got)


def test_layer_matches_dynamic_layer_through_mixed_operations():
    ref, got = DynamicLayer(), GrowingLayer(spare=3)
    both(ref, got, "update", *states(5, seed=1))  # prefill: buffer of 5 + 3
    assert got.capacity() == 8
    buffer = got._key_buffer
    for step in range(3):  # decode into the spare room: no new buffer
        both(ref, got, "update", *states(1, seed=10 + step))
    assert got._key_buffer is buffer and got.capacity() == 8
    both(ref, got, "update", *states(2, seed=20))  # full: grows
    assert got.capacity() == 8 + 2 + 3
    both(ref, got, "crop", -4)  # the prefix cache cuts back, then the next update overwrites the tail
    both(ref, got, "update", *states(2, seed=21))
    both(ref, got, "crop", -1)
    both(ref, got, "batch_repeat_interleave", 2)  # rebinds keys to a new tensor: must re-buffer
    assert not got._owns_views()
    both(ref, got, "update", *states(1, batch=2 * B, seed=22))
    assert got._owns_views()
    both(ref, got, "batch_select_indices", torch.tensor([5, 0, 3]))
    both(ref, got, "update", *states(2, seed=23))
    both(ref, got, "reorder_cache", torch.tensor([2, 0, 1]))
    both(ref, got, "update", *states(1, seed=24))
    both(ref, got, "batch_select_indices", slice(0, 2))  # a view of the same storage but another batch
    both(ref, got, "update", *states(1, batch=2, seed=25))
    both(ref, got, "crop", -ref.get_seq_length())
    both(ref, got, "update", *states(4, batch=2, seed=26))
    both(ref, got, "reset")
    both(ref, got, "update", *states(2, seed=27))
    both(ref, got, "crop", 1)  # legacy positive crop: the length to keep
    both(ref, got, "update", *states(6, seed=28))


def test_rebound_tensors_are_not_written_through():
    """A view taken before a rebinding op stays as it was; the old buffer is no longer the layer's."""
    got = GrowingLayer(spare=8)
    got.update(*states(4, seed=1))
    got.offload()  # `.to("cpu")` is a no-op on the CPU: keys stay views of the buffer
    assert got._owns_views()
    got.keys = got.keys.clone()  # code that rebinds keys to its own copy
    old = got._key_buffer
    before = old.clone()
    got.update(*states(1, seed=2))
    assert got._key_buffer is not old
    assert torch.equal(old.view(torch.int32), before.view(torch.int32))  # bitwise: the spare room is uninitialized


def test_trim_and_stacked_cache():
    got = GrowingLayer(spare=2)
    got.update(*states(20, seed=1))
    keys = got.keys.clone()
    got.crop(-15)
    got.trim(4)
    assert got.capacity() == 5 + 4 and torch.equal(got.keys, keys[:, :, :5])
    k, v = states(10, seed=3)
    cache = stacked_cache([(k, v)], length=6, spare=5)
    assert cache.get_seq_length() == 6 and torch.equal(cache.layers[0].keys, k[:, :, :6])
    cache.update(*states(1, seed=4), layer_idx=0)
    assert cache.layers[0]._key_buffer is k  # decoded into the adopted buffer
    assert len(growing_cache(3).layers) == 3


# ------------------------------------------------------------------ the engine, growing vs plain
SYSTEM = {"role": "system", "content": "You act in a text game. Answer with one action."}
TURN1 = [SYSTEM, {"role": "user", "content": "Goal: find the key.\nYou are in a hall. Exits: north, east."}]
TURN2 = [*TURN1, {"role": "assistant", "content": "go north"}, {"role": "user", "content": "A kitchen."}]
BRANCH = [*TURN1, {"role": "assistant", "content": "go east"}, {"role": "user", "content": "You are in a garden."}]
OTHER = [SYSTEM, {"role": "user", "content": "Goal: light the lamp. You see a lamp and a match."}]


@pytest.fixture(scope="module")
def engine() -> HFPeftEngine:
    from simplan.models.tiny import tiny_model

    base = str(tiny_model("llama", final_norm=1.0))  # unscaled logits: no near-ties between greedy tokens
    eng = make_engine("hf", base, dtype="float32", threads=1, batch_size=8)
    yield eng
    eng.close()


def gen(messages, session=None, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 12)
    return GenerationRequest(messages=messages, session=session, logprobs=True, **kw)


def run_both(engine: HFPeftEngine, calls) -> tuple[list, list]:
    """Each call's results with the growing cache, then again with plain DynamicCaches (fresh prefix caches)."""
    out = {}
    for growing in (True, False):
        engine.growing_kv = growing
        if engine.prefixes is not None:
            engine.prefixes.clear()
        out[growing] = [call(engine) for call in calls]
    engine.growing_kv = True
    return out[True], out[False]


def ids_and_logprobs(results) -> list:
    return [[(c.token_ids, c.logprob, c.min_logprob, c.finish_reason) for c in r.completions] for r in results]


@pytest.mark.parametrize("sessions", [False, True])
def test_generate_is_identical_with_the_growing_cache(engine, sessions):
    s = (lambda name: name) if sessions else (lambda name: None)
    calls = [
        lambda e: e.generate([gen(TURN1, s("a")), gen(OTHER, s("b")), gen(TURN2, s("c"))]),
        lambda e: e.generate([gen(TURN2, s("a")), gen(OTHER, s("b"))]),  # extends a's prefix
        lambda e: e.generate([gen(BRANCH, s("a")), gen(TURN1, s("c"))]),  # diverges: both crop
        # Rows of one session: each row's prefill crops and rewrites the cache the previous row was taken from.
        lambda e: e.generate([gen(TURN2, s("a")), gen(BRANCH, s("a")), gen(TURN1, s("a"))]),
        lambda e: e.generate(
            [gen(TURN2, s("a"), n=3, temperature=1.0, seed=7), gen(OTHER, s("b"), n=3, temperature=0.8, seed=3)]
        ),
        lambda e: e.generate([gen(TURN1, s("a"), stop=["\n\n"], max_tokens=20), gen(BRANCH, s("b"), stop=["\n\n"])]),
    ]
    growing, plain = run_both(engine, calls)
    for g, p in zip(growing, plain):
        assert ids_and_logprobs(g) == ids_and_logprobs(p)
        assert [r.cached_tokens for r in g] == [r.cached_tokens for r in p]
    if sessions:
        extended, branch = growing[1][0], growing[2][0]
        assert 0 < extended.cached_tokens and 0 < branch.cached_tokens < extended.prompt_tokens - 1  # cropped


def test_score_and_choices_are_identical_with_the_growing_cache(engine):
    candidates = ["take key", "go south", "open the drawer", "look"]
    calls = [
        lambda e: [r.logprobs for r in e.score([ScoreRequest(candidates=candidates, messages=TURN1, session="a")])],
        lambda e: [r.logprobs for r in e.score([ScoreRequest(candidates=candidates, messages=TURN2, session="a")])],
        lambda e: e.generate([gen(BRANCH, "a", choices=candidates), gen(TURN2, "a", max_tokens=8)]),
        lambda e: [r.logprobs for r in e.score([ScoreRequest(candidates=candidates, messages=BRANCH, session="a")])],
    ]
    growing, plain = run_both(engine, calls)
    assert growing[0] == plain[0] and growing[1] == plain[1] and growing[3] == plain[3]
    assert ids_and_logprobs(growing[2]) == ids_and_logprobs(plain[2])


def test_the_engine_builds_growing_caches_with_bounded_room(engine):
    engine.prefixes.clear()
    engine.generate([gen(TURN2, "a", max_tokens=5)])
    stored = engine.prefixes._entries["a"][None].kv
    layer = stored.layers[0]
    assert isinstance(layer, GrowingLayer)
    assert layer.capacity() - layer.get_seq_length() <= engine.kv_spare
    engine.generate([gen(TURN1, "a", max_tokens=5)])  # much shorter: cropped, then trimmed when stored
    layer = engine.prefixes._entries["a"][None].kv.layers[0]
    assert layer.capacity() - layer.get_seq_length() <= engine.kv_spare

"""The hf backend's per-session prefix cache (inference/engines/hf_peft.py) on a tiny random float32 model.

    .venv/bin/pytest -q tests/test_prefix_cache.py

The reference is the same engine without a session (the cold, one-call path). A session's later prompts
must give the same greedy tokens and the same logprobs and scores (max abs difference < 1e-4 in float32)
while reporting the shared tokens as `cached_tokens`; a prompt diverging inside the cached part, an
adapter, a batch mixing sessions, sampling with n > 1 and `end_session` are each checked. Drafts (a greedy
request's guess at its completion, checked in one forward) must give the same completion as without one, right,
wrong or half right, and a right one must need no decode step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from simplan.inference.engines import make_engine
from simplan.inference.engines.base import GenerationRequest, MeteredEngine, ScoreRequest
from simplan.inference.engines.common import prompt_ids
from simplan.inference.engines.hf_peft import HFPeftEngine
from simplan.inference.planning.config import SamplingConfig
from simplan.inference.planning.router import BudgetConfig

TOL = 1e-4  # float32: the cached and the cold prefill differ by summation order only (~1e-6)
SYSTEM = {"role": "system", "content": "You act in a text game. Answer with one action."}
TURN1 = [SYSTEM, {"role": "user", "content": "Goal: find the key.\nYou are in a hall. Exits: north, east."}]
TURN2 = [
    *TURN1,
    {"role": "assistant", "content": "go north"},
    {"role": "user", "content": "You are in a kitchen. A key lies on the table."},
]
BRANCH = [  # diverges from TURN2 inside its assistant turn: reuse up to the common prefix only
    *TURN1,
    {"role": "assistant", "content": "go east"},
    {"role": "user", "content": "You are in a garden."},
]
CHOICES = ["take key", "go south", "open drawer", "look"]


def make_adapter(base: str, out: Path, seed: int) -> str:
    """A rank-8 LoRA on every projection with random non-zero B (peft starts B at zero: adapter == base)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    peft_model.save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, dict[str, str]]:
    from simplan.models.tiny import tiny_model

    base = str(tiny_model("llama", final_norm=1.0))  # unscaled logits: no near-ties between greedy tokens
    return base, {"decider": make_adapter(base, tmp_path_factory.mktemp("adapters") / "decider", seed=1)}


@pytest.fixture(scope="module")
def engine(tiny) -> HFPeftEngine:
    eng = make_engine("hf", *tiny, dtype="float32", threads=1, batch_size=8)
    yield eng
    eng.close()


def shared(engine: HFPeftEngine, a: list[dict[str, str]], b: list[dict[str, str]]) -> int:
    """Tokens the prompts of two message lists share at the start."""
    x = prompt_ids(engine.tokenizer, ScoreRequest(candidates=["x"], messages=a))
    y = prompt_ids(engine.tokenizer, ScoreRequest(candidates=["x"], messages=b))
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))


def gen(messages, adapter=None, session=None, max_tokens=8, **kw) -> GenerationRequest:
    return GenerationRequest(
        adapter=adapter, messages=messages, max_tokens=max_tokens, logprobs=True, session=session, tag="decide", **kw
    )


def same_generation(warm, cold) -> None:
    for w, c in zip(warm, cold):
        assert [x.token_ids for x in w.completions] == [x.token_ids for x in c.completions]
        for x, y in zip(w.completions, c.completions):
            assert abs(x.logprob - y.logprob) < TOL
        assert w.prompt_tokens == c.prompt_tokens


@pytest.mark.parametrize("adapter", [None, "decider"])
def test_generate_extending_prompt_reuses_the_prefix(engine, adapter):
    s = f"extend-{adapter}"
    (first,) = engine.generate([gen(TURN1, adapter, s)])
    assert first.cached_tokens == 0, "a new session has nothing cached"
    assert engine.prefixes.tokens(s) == {adapter: first.prompt_tokens}
    (second,) = engine.generate([gen(TURN2, adapter, s)])
    assert second.cached_tokens == shared(engine, TURN1, TURN2) == first.prompt_tokens
    same_generation([first, second], engine.generate([gen(TURN1, adapter), gen(TURN2, adapter)]))
    engine.end_session(s)


def test_diverging_prompt_reuses_up_to_the_common_prefix(engine):
    s = "diverge"
    engine.generate([gen(TURN2, "decider", s)])
    (branch,) = engine.generate([gen(BRANCH, "decider", s)])
    common = shared(engine, TURN2, BRANCH)
    assert 0 < common < branch.prompt_tokens - 1
    assert branch.cached_tokens == common
    same_generation([branch], engine.generate([gen(BRANCH, "decider")]))
    (again,) = engine.generate([gen(TURN2, "decider", s)])  # back to the first: the cache was cropped
    assert again.cached_tokens == common
    same_generation([again], engine.generate([gen(TURN2, "decider")]))
    engine.end_session(s)


def test_adapters_keep_their_own_prefixes(engine):
    s = "two-adapters"
    engine.generate([gen(TURN1, None, s)])
    (other,) = engine.generate([gen(TURN2, "decider", s)])
    assert other.cached_tokens == 0, "the base model's keys and values must not serve the adapter"
    (base,) = engine.generate([gen(TURN2, None, s)])
    assert base.cached_tokens == shared(engine, TURN1, TURN2)
    same_generation([other, base], engine.generate([gen(TURN2, "decider"), gen(TURN2, None)]))
    engine.end_session(s)


@pytest.mark.parametrize("adapter", [None, "decider"])
def test_scores_match_a_cold_prefill(engine, adapter):
    s = f"score-{adapter}"
    (first,) = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=TURN1, session=s)])
    (second,) = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=TURN2, session=s)])
    (branch,) = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=BRANCH, session=s)])
    cold = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=m) for m in (TURN1, TURN2, BRANCH)])
    assert (first.cached_tokens, second.cached_tokens) == (0, shared(engine, TURN1, TURN2))
    assert branch.cached_tokens == shared(engine, TURN2, BRANCH)
    for warm, ref in zip((first, second, branch), cold):
        assert max(abs(a - b) for a, b in zip(warm.logprobs, ref.logprobs)) < TOL
        assert ref.cached_tokens == 0
    # The candidates' trie was cropped off: the same prompt again reuses all but its last token.
    (same,) = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=BRANCH, session=s)])
    assert same.cached_tokens == same.prompt_tokens - 1
    assert max(abs(a - b) for a, b in zip(same.logprobs, cold[2].logprobs)) < TOL
    engine.end_session(s)


@pytest.mark.parametrize("adapter", [None, "decider"])
def test_one_scored_candidate_stays_in_the_sessions_prefix(engine, adapter):
    """The simulator's likelihood of a real observation is a one-candidate score; the next prompt holds that
    observation as the assistant's turn, so the session keeps the candidate's keys and values: the next prompt
    reuses them, and every logprob equals a cold prefill's."""
    s = f"chain-{adapter}"
    reply = TURN2[2]["content"]  # "go north": TURN2 goes on with it as the assistant's turn
    (scored,) = engine.score([ScoreRequest([reply], adapter=adapter, messages=TURN1, session=s)])
    kept = scored.prompt_tokens + scored.num_tokens[0]  # the prompt, the reply and its end of turn
    assert engine.prefixes.tokens(s) == {adapter: kept}
    (second,) = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=TURN2, session=s)])
    assert second.cached_tokens == kept > scored.prompt_tokens  # past TURN1's prompt: through the reply
    assert engine.prefixes.tokens(s) == {adapter: second.prompt_tokens}  # several candidates: cropped off
    cold = engine.score(
        [
            ScoreRequest([reply], adapter=adapter, messages=TURN1),
            ScoreRequest(CHOICES, adapter=adapter, messages=TURN2),
        ]
    )
    assert abs(scored.logprobs[0] - cold[0].logprobs[0]) < TOL
    assert max(abs(a - b) for a, b in zip(second.logprobs, cold[1].logprobs)) < TOL
    (branch,) = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=BRANCH, session=s)])
    assert branch.cached_tokens == shared(engine, TURN2, BRANCH)  # a diverging prompt crops the kept reply
    (cold_branch,) = engine.score([ScoreRequest(CHOICES, adapter=adapter, messages=BRANCH)])
    assert max(abs(a - b) for a, b in zip(branch.logprobs, cold_branch.logprobs)) < TOL
    engine.end_session(s)


def test_choices_and_sampling_with_a_cached_prefix(engine):
    s = "choices"
    engine.generate([gen(TURN1, "decider", s)])
    (chosen,) = engine.generate([gen(TURN2, "decider", s, choices=CHOICES)])
    assert chosen.cached_tokens == shared(engine, TURN1, TURN2)
    same_generation([chosen], engine.generate([gen(TURN2, "decider", choices=CHOICES)]))
    sample = {"n": 3, "temperature": 1.0, "seed": 11}
    (sampled,) = engine.generate([gen(TURN2, "decider", s, **sample)])
    assert len(sampled.completions) == 3 and sampled.cached_tokens == sampled.prompt_tokens - 1
    same_generation([sampled], engine.generate([gen(TURN2, "decider", **sample)]))
    engine.end_session(s)


def test_a_batch_mixing_sessions_equals_running_them_apart(engine):
    engine.generate([gen(TURN1, "decider", "a"), gen(BRANCH, "decider", "b")])
    batch = [gen(TURN2, "decider", "a"), gen(BRANCH, "decider", "b"), gen(TURN1, "decider")]
    mixed = engine.generate(batch)
    assert [r.cached_tokens for r in mixed] == [shared(engine, TURN1, TURN2), mixed[1].prompt_tokens - 1, 0]
    apart = [engine.generate([r])[0] for r in batch]
    same_generation(mixed, apart)
    same_generation(mixed, engine.generate([gen(TURN2, "decider"), gen(BRANCH, "decider"), gen(TURN1, "decider")]))
    engine.end_session("a")
    engine.end_session("b")


def test_a_batch_of_branches_of_one_session_equals_cold(engine):
    """Rollout branches: several prompts of ONE session in one batch, each extending the cached prompt and
    diverging from the others (each row's prefill crops and extends the session's cache in turn)."""
    s = "branches"
    engine.generate([gen(TURN1, None, s)])
    batch = [gen(TURN2, None, s), gen(BRANCH, None, s), gen(TURN2, None, s)]
    warm = engine.generate(batch)
    common = shared(engine, TURN2, BRANCH)
    assert [r.cached_tokens for r in warm] == [shared(engine, TURN1, TURN2), common, common]
    same_generation(warm, engine.generate([gen(TURN2), gen(BRANCH), gen(TURN2)]))
    engine.end_session(s)


def test_end_session_frees_and_the_cache_is_bounded(engine):
    engine.generate([gen(TURN1, "decider", "ends")])
    engine.score([ScoreRequest(CHOICES, messages=TURN1, session="ends")])
    assert set(engine.prefixes.tokens("ends")) == {"decider", None}
    metered = MeteredEngine(engine, session="ends")
    (res,) = metered.generate([gen(TURN2, "decider")])  # the meter stamps its session on the request
    assert res.cached_tokens > 0 and metered.cached_tokens == res.cached_tokens
    metered.end_session()
    assert engine.prefixes.tokens("ends") == {}
    (cold,) = engine.generate([gen(TURN2, "decider", "ends")])
    assert cold.cached_tokens == 0
    engine.end_session("ends")
    held = engine.prefixes.sessions
    for i in range(held + 3):
        engine.generate([gen(TURN1, None, f"lru-{i}")])
    assert len(engine.prefixes) == held
    assert engine.prefixes.tokens("lru-0") == {} and engine.prefixes.tokens(f"lru-{held + 2}")
    for i in range(held + 3):
        engine.end_session(f"lru-{i}")
    assert len(engine.prefixes) == 0


def test_zero_sessions_turns_it_off(tiny):
    off = HFPeftEngine(*tiny, dtype="float32", threads=1, prefix_cache_sessions=0)
    assert off.prefixes is None
    off.generate([gen(TURN1, "decider", "off")])
    (res,) = off.generate([gen(TURN2, "decider", "off")])
    assert res.cached_tokens == 0
    off.close()
    with pytest.raises(ValueError, match="prefix_cache_sessions"):
        HFPeftEngine("unused", prefix_cache_sessions=-1)  # checked before any model loads


def test_planner_episode_reuses_prefixes_records_them_and_ends_its_session(tiny, engine):
    """The same toy episode with and without the cache: same actions and prompt tokens; the cached run's
    trace records reused tokens per act, imagine and end event, and the session is freed at the end."""
    from simplan.envs.registry import make_env
    from simplan.inference.planning.planner import Planner, PlannerConfig

    cold = HFPeftEngine(*tiny, dtype="float32", threads=1, prefix_cache_sessions=0)
    config = PlannerConfig(
        arm="simplan",
        k=2,
        horizon=1,
        simulator_adapter="",
        budgets=BudgetConfig(max_steps=4),
        sampling=SamplingConfig(simulator_max_tokens=8),
    )
    runs = []
    for eng in (engine, cold):
        env = make_env("toy")
        try:
            runs.append(Planner(eng, env, config).run(env.tasks("dev", limit=1)[0], episode_id="planner-session"))
        finally:
            env.close()
    cold.close()
    warm, ref = runs
    assert [e.action for e in warm.trace.of_type("act")] == [e.action for e in ref.trace.of_type("act")]
    assert warm.summary.prompt_tokens == ref.summary.prompt_tokens and ref.summary.cached_prompt_tokens == 0
    acts, end = warm.trace.of_type("act"), warm.trace.end
    assert len(acts) >= 2 and all(a.cached_prompt_tokens > 0 for a in acts[1:]), "later steps extend the prompt"
    assert any(e.cached_prompt_tokens > 0 for e in warm.trace.of_type("imagine"))
    assert end.cached_prompt_tokens == warm.summary.cached_prompt_tokens == sum(a.cached_prompt_tokens for a in acts)
    assert 0 < end.cached_prompt_tokens < end.prompt_tokens
    assert engine.prefixes.tokens("planner-session") == {}, "the planner ends its session"


def test_the_engine_option_reaches_the_hf_backend(tiny):
    from simplan.inference.engines import engine_from_config
    from simplan.inference.engines.config import EngineConfig, HFOptions

    base, adapters = tiny
    eng = engine_from_config(
        EngineConfig(
            engine="hf",
            model=base,
            adapters=f"decider={adapters['decider']}",
            dtype="float32",
            hf=HFOptions(prefix_cache_sessions=3),
            merge_adapters=False,  # the multi-LoRA engine's own prefix cache (auto would merge on the CPU)
        )
    )
    assert eng.prefixes is not None and eng.prefixes.sessions == 3
    eng.close()
    with pytest.raises(ValueError, match="prefix_cache_sessions"):
        HFOptions(prefix_cache_sessions=-1)


# ---------------------------------------------------------------------------------------------
# Drafts (base.py "Drafts"): the same greedy completion with fewer decode steps


def drafted(messages, draft, adapter=None, session=None, max_tokens=8) -> GenerationRequest:
    return gen(messages, adapter, session, max_tokens, draft=draft)


def text_of(engine, messages, adapter=None, max_tokens=8) -> str:
    (res,) = engine.generate([drafted(messages, None, adapter, max_tokens=max_tokens)])
    return res.completions[0].text


@pytest.mark.parametrize("adapter", [None, "decider"])
def test_a_draft_gives_the_greedy_completion_right_wrong_or_half_right(engine, adapter):
    plain = engine.generate([gen(m, adapter) for m in (TURN1, TURN2, BRANCH)])
    right = text_of(engine, TURN2, adapter)
    half = engine.tokenizer.decode(plain[1].completions[0].token_ids[:3]) + " something else entirely"
    drafts = [right, "zebra " * 20, half]
    for session in (None, f"draft-{adapter}"):
        for draft in drafts:
            got = engine.generate([drafted(m, draft, adapter, session) for m in (TURN1, TURN2, BRANCH)])
            same_generation(got, plain)
            for g, p in zip(got, plain):
                c, q = g.completions[0], p.completions[0]
                assert (c.text, c.finish_reason, c.num_tokens) == (q.text, q.finish_reason, q.num_tokens)
                assert abs(c.min_logprob - q.min_logprob) < TOL
        if session:
            engine.end_session(session)


def test_a_draft_past_the_end_stops_where_greedy_stops(engine):
    """A draft longer than max_tokens, or running on past the model's end of text, is cut where greedy is."""
    for max_tokens in (1, 3, 40):
        (plain,) = engine.generate([drafted(TURN2, None, max_tokens=max_tokens)])
        text = plain.completions[0].text
        for draft in (text, text + " and more words after it", ""):
            (got,) = engine.generate([drafted(TURN2, draft, max_tokens=max_tokens)])
            assert got.completions[0].token_ids == plain.completions[0].token_ids
            assert got.completions[0].finish_reason == plain.completions[0].finish_reason


def test_drafted_and_plain_requests_of_two_adapters_in_one_call(engine):
    reqs = [
        drafted(TURN1, text_of(engine, TURN1), None, "mix-a"),
        gen(TURN2, "decider", "mix-b"),
        drafted(BRANCH, "go east", "decider", "mix-c"),
        drafted(TURN2, "nothing like it", None),
    ]
    cold = engine.generate([dataclasses.replace(r, draft=None, session=None) for r in reqs])
    same_generation(engine.generate(reqs), cold)
    for s in ("mix-a", "mix-b", "mix-c"):
        engine.end_session(s)


def test_sampling_and_constrained_requests_ignore_the_draft(engine):
    """Only greedy, unconstrained requests check a draft: a sampled one's output does not depend on it."""
    for kw in ({"temperature": 0.8, "n": 3, "seed": 7}, {"regex": "(go|take) [a-z]+"}):
        (a,) = engine.generate([gen(TURN2, **kw)])  # one call each: a sampled batch's rows share one generator
        (b,) = engine.generate([gen(TURN2, draft="take key", **kw)])
        assert [c.text for c in a.completions] == [c.text for c in b.completions]


def test_a_right_draft_needs_no_decode_step(engine, monkeypatch):
    """A draft of k right tokens gives k + 1 tokens in one forward: no decode step up to max_tokens k + 1."""
    (plain,) = engine.generate([drafted(TURN2, None, max_tokens=8)])
    ids = plain.completions[0].token_ids

    def reencodes(k: int) -> bool:  # a random model's "\n\n" re-encodes as one token, not two
        text = engine.tokenizer.decode(ids[:k], skip_special_tokens=True)
        return prompt_ids(engine.tokenizer, GenerationRequest(prompt=text)) == ids[:k]

    k = max(k for k in range(1, 8) if reencodes(k))
    draft = engine.tokenizer.decode(ids[:k], skip_special_tokens=True)
    calls = []
    decode = engine._generate_batch
    monkeypatch.setattr(engine, "_generate_batch", lambda *a, **kw: calls.append(1) or decode(*a, **kw))
    (got,) = engine.generate([drafted(TURN2, draft, max_tokens=k + 1)])
    assert got.completions[0].token_ids == ids[: k + 1] and calls == []
    (got,) = engine.generate([drafted(TURN2, draft, max_tokens=8)])  # past the draft's tokens: decoded
    assert got.completions[0].token_ids == ids and len(calls) == 1

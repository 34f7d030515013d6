"""Engine lanes (inference/engines/lanes.py): the engine in N processes serves the protocol as the engine itself
does, errors keep their type, a dead lane says so and is left out, the batcher keeps an episode on one lane and
spreads episodes over lanes, and `lanes: auto` resolves as documented. The eval on lanes against one engine:
tests/test_engines.py `test_an_eval_on_engine_lanes_matches_one_engine`."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from simplan.inference.engines import EngineConfig, engine_lanes, is_merged, make_engine, resolve_lanes
from simplan.inference.engines.base import (
    Completion,
    EmbedRequest,
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
)
from simplan.inference.engines.batching import Cancelled, batcher_for
from simplan.inference.engines.config import HFOptions
from simplan.inference.engines.lanes import LaneBatcher, LanedEngine, LaneDied

MESSAGES = [
    [{"role": "user", "content": "Goal: find the key.\n\nCurrent observation:\nYou are in a hall.\n\nNext action?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Observation after go north?"}],
]


@pytest.fixture(scope="module")
def base() -> str:
    from simplan.models.tiny import tiny_model

    return str(tiny_model("llama", final_norm=1.0))  # unscaled logits: no greedy ties between kernels


@pytest.fixture(scope="module")
def lanes(base):
    engine = LanedEngine("hf", base, {}, 2, dtype="float32", threads=1, batch_size=8)
    yield engine
    engine.close()


def test_lanes_serve_the_protocol_as_the_engine_does(base, lanes) -> None:
    one = make_engine("hf", base, None, dtype="float32", threads=1, batch_size=8)
    try:
        gen = [GenerationRequest(messages=m, max_tokens=8, logprobs=True, session="ep-1") for m in MESSAGES]
        got, want = lanes.generate(gen), one.generate(gen)
        assert [(c.text, c.token_ids, c.logprob) for r in got for c in r.completions] == [
            (c.text, c.token_ids, c.logprob) for r in want for c in r.completions
        ]
        score = [ScoreRequest(messages=MESSAGES[0], candidates=["go north", "look", "take key"])]
        assert lanes.score(score)[0].logprobs == pytest.approx(one.score(score)[0].logprobs, abs=1e-5)
        embed = [EmbedRequest(text="You are in a hall.")]
        assert lanes.embed(embed)[0].vector == pytest.approx(one.embed(embed)[0].vector, abs=1e-5)
    finally:
        one.close()
    lanes.end_session("ep-1")  # freed with each lane's next call
    assert lanes.generate(gen[:1])[0].completions[0].text == got[0].completions[0].text
    assert lanes.adapters == [] and lanes.tokenizer is not None and not is_merged(lanes)
    assert engine_lanes(lanes) == 2 and lanes.usage.calls == 3  # generate, score, generate (embed: none)
    assert (len(lanes.lanes), lanes.backend, lanes.threads) == (2, "HFPeftEngine", 1)


def test_an_error_in_a_lane_is_raised_in_the_caller_with_its_type_and_the_lanes_traceback(lanes) -> None:
    with pytest.raises(KeyError, match="unknown adapter 'nope'") as caught:  # callers catch errors by their type
        lanes.generate([GenerationRequest(messages=MESSAGES[0], adapter="nope")])
    assert any("raised in engine lane" in note and "Traceback" in note for note in caught.value.__notes__)
    assert lanes.generate([GenerationRequest(messages=MESSAGES[0], max_tokens=2)])  # the lane serves on


def test_lanes_ignore_ctrl_c_the_eval_decides_what_it_stops(lanes) -> None:
    for lane in lanes.lanes:
        os.kill(lane.lane.process.pid, signal.SIGINT)
    time.sleep(0.5)
    assert all(lane.lane.process.poll() is None for lane in lanes.lanes)
    assert lanes.generate([GenerationRequest(messages=MESSAGES[1], max_tokens=2)])


def test_a_lane_that_dies_fails_its_calls_with_its_exit_code_and_is_left_out(base) -> None:
    engine = LanedEngine("hf", base, {}, 2, dtype="float32", threads=1)
    try:
        victim = engine.lanes[0]
        victim.lane.process.kill()
        victim.lane.process.wait()
        with pytest.raises(LaneDied, match=r"engine lane 0 \(pid \d+\) exited with code -9 \(killed by the OS"):
            victim.generate([GenerationRequest(messages=MESSAGES[0], max_tokens=2)])
        with pytest.raises(LaneDied, match="engine lane 0"):  # and again, without waiting on a dead pipe
            victim.score([ScoreRequest(messages=MESSAGES[0], candidates=["look"])])
        for _ in range(3):  # calls outside a batcher go to the lane alive
            assert engine.generate([GenerationRequest(messages=MESSAGES[0], max_tokens=2)])
        batcher = engine.batcher()
        with batcher.session():  # new episodes too
            assert batcher.generate([GenerationRequest(messages=MESSAGES[0], max_tokens=2)])
        batcher.close()
        survivor = engine.lanes[1].lane
        survivor._conn.close()  # the eval process gone (its end of the socket closed): the lane ends by itself
        assert survivor.process.wait(timeout=30) == 0
    finally:
        engine.close()


def test_a_lane_whose_engine_cannot_load_raises_the_error_of_the_engine(tmp_path) -> None:
    with pytest.raises(OSError):
        LanedEngine("hf", str(tmp_path / "no-model"), {}, 2, dtype="float32", threads=1)


def test_a_tokenizer_that_does_not_pickle_is_loaded_in_the_eval_process(base) -> None:
    from simplan.inference.engines.lanes import _own_tokenizer, _picklable

    class Unpicklable:
        def __reduce__(self):
            raise TypeError("cannot pickle")

    assert _picklable(Unpicklable()) is None and _picklable({"a": 1}) == {"a": 1}
    assert _own_tokenizer(base)("go north")["input_ids"]


# ---------------------------------------------------------------------------------------------
# The batcher over lanes, with in-process lanes
# ---------------------------------------------------------------------------------------------
class _Lane:
    """A lane stand-in: answers with its own index, records the sessions of the calls it served."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lane = SimpleNamespace(dead=None)
        self.adapters: list[str] = []
        self.usage = EngineUsage()
        self.sessions: list[str | None] = []

    def generate(self, requests):
        self.sessions += [r.session for r in requests]
        time.sleep(0.01)
        return [GenerationResult([Completion(f"lane {self.index}", 1)], 1, 1, 0.0) for _ in requests]


def _fake_laned(n: int) -> SimpleNamespace:
    return SimpleNamespace(lanes=[_Lane(i) for i in range(n)], adapters=[], tokenizer=None)


def test_the_batcher_keeps_each_episode_on_one_lane_and_spreads_episodes_evenly() -> None:
    engine = _fake_laned(2)
    batcher = LaneBatcher(engine, window=0.005)  # type: ignore[arg-type]
    served: dict[str, set[str]] = {}
    start = threading.Barrier(4)

    def episode(name: str) -> None:
        with batcher.session():
            start.wait()
            for _ in range(5):
                r = batcher.generate([GenerationRequest(messages=MESSAGES[0], session=name)])
                served.setdefault(name, set()).add(r[0].completions[0].text)

    threads = [threading.Thread(target=episode, args=(f"ep{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(lanes) == 1 for lanes in served.values())  # its prefix cache is on that lane
    assert sorted(len(set(lane.sessions)) for lane in engine.lanes) == [2, 2]
    stats = batcher.stats.to_dict()
    assert stats["lanes"] == 2 and stats["lane_calls"] == [10, 10] and stats["episode_calls"] == 20
    assert batcher.usage.calls == 20
    batcher.close()


def test_an_episode_moves_when_its_lane_holds_two_more_than_another_and_keeps_its_cancel() -> None:
    """The last episodes of an eval sharing one lane while the other idles: one moves at its next call."""
    engine = _fake_laned(2)
    batcher = LaneBatcher(engine, window=0.0)  # type: ignore[arg-type]
    handles, lanes, errors = {}, {}, {}
    joined, go = {n: threading.Event() for n in "abc"}, {n: threading.Event() for n in "abc"}

    def episode(name: str) -> None:
        with batcher.session() as handle:
            handles[name], lanes[name] = handle, [handle.lane]
            joined[name].set()
            go[name].wait()
            if name == "b":
                return  # b's episode ends
            try:
                text = batcher.generate([GenerationRequest(messages=MESSAGES[0])])[0].completions[0].text
                lanes[name].append(int(text.split()[-1]))
            except Cancelled as e:
                errors[name] = str(e)
            lanes[name].append(handle.lane)

    threads = {n: threading.Thread(target=episode, args=(n,)) for n in "abc"}
    for n in "abc":  # a on lane 0, b on lane 1, c on lane 0
        threads[n].start()
        joined[n].wait()
    go["b"].set()
    threads["b"].join()  # lane 0 holds a and c, lane 1 none
    handles["c"].cancel("budget")
    go["c"].set()
    threads["c"].join()
    go["a"].set()
    threads["a"].join()
    assert lanes == {"a": [0, 0, 0], "b": [1], "c": [0, 1]}  # c moved (a then had lane 0 to itself)
    assert errors == {"c": "budget"}  # cancelled before the move, still after it
    assert batcher.moves == 1 and batcher.stats.to_dict()["moves"] == 1
    batcher.close()


def test_new_episodes_go_to_lanes_still_alive_and_cancel_reaches_every_lane() -> None:
    engine = _fake_laned(2)
    engine.lanes[0].lane.dead = "engine lane 0: gone"
    batcher = LaneBatcher(engine, window=0.0)  # type: ignore[arg-type]
    with batcher.session(), batcher.session():
        assert batcher.generate([GenerationRequest(messages=MESSAGES[0])])[0].completions[0].text == "lane 1"
    batcher.cancel("stop")
    with batcher.session(), pytest.raises(Cancelled, match="stop"):
        batcher.generate([GenerationRequest(messages=MESSAGES[0])])
    batcher.close()


def test_batcher_for_uses_an_engines_own_batcher() -> None:
    from simplan.inference.engines.batching import BatchingEngine
    from simplan.inference.engines.scripted import ScriptedEngine

    plain = batcher_for(ScriptedEngine(lambda r: "look"), 0.01)
    assert isinstance(plain, BatchingEngine)
    plain.close()
    engine = _fake_laned(3)
    engine.batcher = lambda window: LaneBatcher(engine, window)  # type: ignore[arg-type]
    laned = batcher_for(engine, 0.01)  # type: ignore[arg-type]
    assert isinstance(laned, LaneBatcher) and len(laned.batchers) == 3
    laned.close()


# ---------------------------------------------------------------------------------------------
# lanes: auto
# ---------------------------------------------------------------------------------------------
def test_lanes_auto_is_one_per_core_for_concurrent_episodes_of_an_hf_engine_on_a_cpu() -> None:
    cpu = EngineConfig(engine="hf", hf=HFOptions(device="cpu"))
    assert (resolve_lanes(cpu, concurrent=True, cores=2).lanes, resolve_lanes(cpu, True, cores=2).threads) == (2, 1)
    eight = resolve_lanes(cpu, concurrent=True, cores=8)
    assert (eight.lanes, eight.threads) == (4, 2)  # at most MAX_AUTO_LANES, the threads shared among them
    assert resolve_lanes(EngineConfig(threads=1, hf=HFOptions(device="cpu")), True, cores=2).lanes == 1
    assert resolve_lanes(cpu, concurrent=False, cores=2).lanes == 1  # one episode: the engine in the process
    assert resolve_lanes(EngineConfig(engine="hf", hf=HFOptions(device="cuda")), True, cores=2).lanes == 1
    assert resolve_lanes(EngineConfig(engine="openai"), True, cores=2).lanes == 1
    three = resolve_lanes(EngineConfig(lanes=3, threads=6), concurrent=False, cores=2)
    assert (three.lanes, three.threads) == (3, 2)  # a number is kept, whatever the command
    assert resolve_lanes(EngineConfig(lanes="1"), True, cores=2).lanes == 1
    assert "2 engine lanes of 1 thread each" in resolve_lanes(cpu, True, cores=2).line()


@pytest.mark.parametrize("value", ["two", 0, "1.5", -1])
def test_a_lanes_value_that_is_not_auto_or_a_count_is_refused(value) -> None:
    with pytest.raises(ValueError, match="lanes"):
        EngineConfig(lanes=value)


def test_lanes_need_the_hf_engine() -> None:
    with pytest.raises(ValueError, match="lanes: 2 engine processes need engine hf"):
        EngineConfig(engine="vllm", lanes=2)
    assert EngineConfig(engine="vllm", lanes="auto").lanes == "auto"


def test_two_processes_merging_one_adapter_at_once_merge_it_once(tmp_path, monkeypatch) -> None:
    """Lanes start side by side: the merge lock lets one merge while the other waits and reuses its folder."""
    from simplan.inference.engines import merged

    merges = []

    def slow_merge(base_path: str, adapter: Path, out: Path) -> None:
        merges.append(out)
        time.sleep(0.3)
        out.mkdir(parents=True)
        (out / merged.MANIFEST).write_text("{}")

    monkeypatch.setattr(merged, "_merge", slow_merge)
    monkeypatch.setattr(merged, "merged_folder", lambda base, adapter, cache=None: tmp_path / "cache" / "m")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    folders: list[Path] = []
    threads = [
        threading.Thread(target=lambda: folders.append(merged.merged_model("base", str(adapter)))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(merges) == 1 and folders == [tmp_path / "cache" / "m"] * 2

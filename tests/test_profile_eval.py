"""bench/profile_eval.py classes each py-spy sample of an eval, with engine lanes too: the eval process's lane
round trips, and the lane processes' own model forwards and waits; the CPU of lanes and JVMs is kept apart."""

from __future__ import annotations


def test_samples_of_an_eval_on_engine_lanes_are_classed(bench_script) -> None:
    prof = bench_script("profile_eval")
    round_trip = [
        "_bootstrap (threading.py:1)",
        "_loop (inference/engines/batching.py:9)",
        "_ask (inference/engines/lanes.py:3)",
    ]
    assert prof.classify("batching-engine", round_trip) == ("dispatcher", "lane round trip")
    forward = ["serve (inference/engines/lanes.py:1)", "generate (inference/engines/hf_peft.py:2)"]
    forward += ["forward (transformers/models/llama/modeling_llama.py:3)"]
    assert prof.classify(prof.LANE, forward) == ("lane", "model forward")
    waiting = ["serve (inference/engines/lanes.py:1)", "recv (multiprocessing/connection.py:2)"]
    waiting += ["_recv (multiprocessing/connection.py:3)"]
    assert prof.classify(prof.LANE, waiting) == ("lane", "idle")
    python = ["serve (inference/engines/lanes.py:1)", "generate (inference/engines/hf_peft.py:2)"]
    assert prof.classify(prof.LANE, python) == ("lane", "engine python")
    raw = (
        "thread (0x1): MainThread;" + ";".join(forward) + " 3\nthread (0x1): MainThread;" + ";".join(waiting) + " 1\n"
    )
    per_thread = prof.parse_raw(raw, main=prof.LANE, key="lane0:")
    assert prof.shares(per_thread, "lane") == {"idle": 0.25, "model forward": 0.75}


def test_the_cpu_of_engine_lanes_and_jvms_is_kept_apart(bench_script) -> None:
    prof = bench_script("profile_eval")
    start = {"time": 0.0, "self": (1.0, 0.0), "children": {7: (0.0, 0.0), 8: (0.0, 0.0), 9: (5.0, 1.0)}}
    end = {"time": 10.0, "self": (3.0, 1.0), "children": {7: (9.0, 1.0), 8: (8.0, 2.0), 9: (6.0, 1.0)}}
    cpu = prof.cpu_window(start, end, lanes={7, 8})
    assert (cpu["lanes"], cpu["lane_user_cores"], cpu["lane_system_cores"]) == (2, 1.7, 0.3)
    assert (cpu["jvms"], cpu["jvm_user_cores"], cpu["eval_user_cores"]) == (1, 0.1, 0.2)

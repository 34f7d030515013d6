"""Where the wall time of `simplan eval` goes: a py-spy profile of every thread, and the CPU of the JVMs.

    .venv/bin/python bench/profile_eval.py --out runs/profile/reactive --seconds 240 -- \
        .venv/bin/simplan eval --suite twx-dev --arms reactive --engine hf ... --concurrency 12 --out runs/x

Starts the command, lets it warm up (`--warmup` seconds: model load, JVM starts), samples every thread
with py-spy (`--rate` Hz, idle threads included, without pausing the process) for `--seconds`, then stops
the command (SIGINT, as Ctrl-C) unless `--keep` is given. Each sample of a thread is put in one class
by its stack:

- the dispatcher thread (`batching-engine`, the only thread that runs the model): `model forward`
  (inside a transformers model's or a torch module's forward), `generate loop` (transformers' generation
  code outside the forward: logits processors, stop-string checks, cache bookkeeping), `engine python`
  (simplan's engine code around the calls: tokenising, padding, tries, decoding), `idle` (waiting for
  requests);
- each episode thread: `waiting for the model` (inside a batcher call: queued or in flight), `env`
  (inside an env adapter: the JVM's round trip over py4j), `planner python` (the rest while running),
  `idle`.

With engine lanes (`--lanes N`, inference/engines/lanes.py) the model runs in lane processes: each lane's
BatchingEngine thread in the eval process is a `lane round trip` (a call sent and waited for), and each lane
process is sampled too (role `lane`: `model forward`, `generate loop`, `engine python`, `idle` while it waits
for a call).

Shares are of the thread's samples, so of wall time. Beside them, from /proc: the CPU seconds (user and
system) of this process, of its JVM children and of its engine lanes over the same window, and the load average. Writes
profile.json and profile.md (the table) to --out, and the raw py-spy stacks (profile.raw) for a flame graph.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

DISPATCHER = "batching-engine"
LANE = "lane"  # the name parse_raw gives an engine lane process's main thread
IDLE_FILES = ("batching.py", "lanes.py")  # a dispatcher or lane there is waiting for work, not computing
CLOCK = os.sysconf("SC_CLK_TCK")


SIMPLAN = ("core/", "data/", "envs/", "evaluation/", "inference/", "models/", "scripts/", "training/", "workflows/")


def classify(thread: str, frames: list[str]) -> tuple[str, str]:
    """(role, class) of one sample: `frames` run outermost first, each `func (file:line)`, the file as
    py-spy shortens it (relative to its sys.path entry: `inference/engines/hf_peft.py`, `threading.py`)."""
    files = [f[f.rfind("(") + 1 :].removeprefix("simplan/") for f in frames]  # simplan/: a frozen worktree's shim
    leaf = frames[-1] if frames else ""
    waiting = any(w in leaf for w in ("wait (threading.py", "_wait_for_tstate_lock", "get (queue.py", "select ("))
    mine = [f for f in files if f.startswith(SIMPLAN)]
    if thread == DISPATCHER and any(f.startswith("inference/engines/lanes.py") for f in mine):
        return "dispatcher", "lane round trip"
    if thread in (DISPATCHER, LANE):
        role = "dispatcher" if thread == DISPATCHER else "lane"
        if any(f.startswith(("transformers/models/", "torch/nn/modules/")) for f in files):
            return role, "model forward"
        if any(f.startswith("transformers/generation/") for f in files):
            return role, "generate loop"
        engine = any(f.startswith("inference/engines/") and not any(x in f for x in IDLE_FILES) for f in mine)
        if waiting or "recv" in leaf or not engine:
            return role, "idle"
        return role, "engine python"
    if thread != "MainThread" and any(f.startswith(("inference/planning/", "evaluation/")) for f in mine):
        if any(f.startswith("inference/engines/batching.py") for f in mine):
            return "episode", "waiting for the model"
        if any(f.startswith(("envs/", "py4j/", "textworld_express/", "scienceworld/")) for f in files):
            return "episode", "env"
        return "episode", "idle" if waiting else "planner python"
    return "other", "idle" if waiting else "running"


def parse_raw(text: str, main: str = "MainThread", key: str = "") -> dict[str, Counter]:
    """Per thread, py-spy's raw lines (`thread (tid): name;frame;...;frame COUNT`) as class -> samples; the main
    thread is classed as `main` (LANE for an engine lane's profile), `key` tells processes' threads apart."""
    per_thread: dict[str, Counter] = defaultdict(Counter)
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *frames = stack.split(";")
        tid, _, name = head.partition(": ")
        name = name.strip()
        role, cls = classify(main if name == "MainThread" else name, frames)
        per_thread[f"{role}|{key}{tid}"][cls] += int(count)
    return per_thread


def shares(per_thread: dict[str, Counter], role: str) -> dict[str, float]:
    """Mean over the role's threads of each class's share of the thread's samples."""
    threads = [c for key, c in per_thread.items() if key.startswith(role + "|") and sum(c.values())]
    if not threads:
        return {}
    classes = sorted({k for c in threads for k in c})
    return {k: round(sum(c[k] / sum(c.values()) for c in threads) / len(threads), 4) for k in classes}


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of one process, 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return int(fields[11]) / CLOCK, int(fields[12]) / CLOCK


def is_lane(pid: int) -> bool:
    """Whether `pid` is an engine lane (inference/engines/lanes.py starts them as `python -c "...lanes import
    serve..."`); the eval's other children are the JVMs py4j launched."""
    try:
        return b"simplan.inference.engines.lanes" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """Direct children of `pid` (the JVMs py4j launched, and the engine lanes)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def cpu_snapshot(pid: int) -> dict[str, Any]:
    kids = {k: cpu_seconds(k) for k in children(pid)}
    return {"time": time.monotonic(), "self": cpu_seconds(pid), "children": kids}


def cpu_window(start: dict[str, Any], end: dict[str, Any], lanes: set[int] | None = None) -> dict[str, float]:
    """Cores busy on average over the window: the eval process, its JVMs, its engine lanes (`lanes`: their pids)."""
    lanes = lanes or set()
    wall = end["time"] - start["time"]
    su, ss = (e - s for e, s in zip(end["self"], start["self"]))

    def used(pids: set[int]) -> tuple[float, float]:
        u = sum(end["children"][k][0] - start["children"].get(k, (0.0, 0.0))[0] for k in pids)
        s_ = sum(end["children"][k][1] - start["children"].get(k, (0.0, 0.0))[1] for k in pids)
        return u / wall, s_ / wall

    jvms = set(end["children"]) - lanes
    (ju, js), (lu, ls) = used(jvms), used(lanes & set(end["children"]))
    return {
        "wall_s": round(wall, 1),
        "eval_user_cores": round(su / wall, 3),
        "eval_system_cores": round(ss / wall, 3),
        "jvm_user_cores": round(ju, 3),
        "jvm_system_cores": round(js, 3),
        "jvms": len(jvms),
        "lane_user_cores": round(lu, 3),
        "lane_system_cores": round(ls, 3),
        "lanes": len(lanes),
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| thread | class | share of wall |", "|---|---|---:|"]
    for role in ("dispatcher", "lane", "episode"):
        for cls, share in sorted(result["shares"][role].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {role} | {cls} | {100 * share:.1f}% |")
    cpu = result["cpu"]
    lines.append("")
    lines.append(
        f"CPU over {cpu['wall_s']} s (cores busy on average): eval process user {cpu['eval_user_cores']}, "
        f"system {cpu['eval_system_cores']}; {cpu['jvms']} JVMs user {cpu['jvm_user_cores']}, "
        f"system {cpu['jvm_system_cores']}; {cpu.get('lanes', 0)} engine lanes user {cpu.get('lane_user_cores', 0)}, "
        f"system {cpu.get('lane_system_cores', 0)}; load average before {result['load_before']}, after "
        f"{result['load_after']}; {result['episode_threads']} episode threads."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: profile_eval.py [options] -- <simplan eval command>")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=240)
    p.add_argument("--warmup", type=float, default=60)
    p.add_argument("--rate", type=int, default=25)
    p.add_argument("--keep", action="store_true", help="let the command finish instead of stopping it")
    args = p.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit(
            f"profile_eval.py: no py-spy beside {sys.executable}; install it: {sys.executable} -m pip install py-spy"
        )
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    with open(out / "command.log", "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(args.warmup)
        lanes = sorted(k for k in children(proc.pid) if is_lane(k))
        start = cpu_snapshot(proc.pid)
        targets = [(proc.pid, out / "profile.raw")] + [(k, out / f"profile-lane{i}.raw") for i, k in enumerate(lanes)]
        spies = [
            subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--rate", str(args.rate), "--duration", str(int(args.seconds))]
                + ["--threads", "--idle", "--nonblocking", "--format", "raw", "--output", str(raw)],
                stdout=subprocess.DEVNULL,
            )
            for pid, raw in targets
        ]
        for spy_proc in spies:
            if spy_proc.wait() != 0:
                raise SystemExit(f"py-spy failed ({spy_proc.args})")
        end = cpu_snapshot(proc.pid)
        load_after = Path("/proc/loadavg").read_text().split()[:3]
        if not args.keep:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # a second Ctrl-C cancels the episodes in flight
                proc.wait()
        else:
            proc.wait()
    per_thread = parse_raw((out / "profile.raw").read_text())
    for i, _ in enumerate(lanes):
        per_thread.update(parse_raw((out / f"profile-lane{i}.raw").read_text(), main=LANE, key=f"lane{i}:"))
    result = {
        "command": command,
        "shares": {role: shares(per_thread, role) for role in ("dispatcher", "lane", "episode")},
        "episode_threads": sum(1 for k in per_thread if k.startswith("episode|")),
        "cpu": cpu_window(start, end, set(lanes)),
        "load_before": " ".join(load_before),
        "load_after": " ".join(load_after),
    }
    (out / "profile.json").write_text(json.dumps(result, indent=2))
    (out / "profile.md").write_text(table(result) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

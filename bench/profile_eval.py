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

Shares are of the thread's samples, so of wall time. Beside them, from /proc: the CPU seconds (user and
system) of this process and of its JVM children over the same window, and the load average. Writes
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
CLOCK = os.sysconf("SC_CLK_TCK")


SIMPLAN = ("core/", "data/", "envs/", "evaluation/", "inference/", "models/", "scripts/", "training/", "workflows/")


def classify(thread: str, frames: list[str]) -> tuple[str, str]:
    """(role, class) of one sample: `frames` run outermost first, each `func (file:line)`, the file as
    py-spy shortens it (relative to its sys.path entry: `inference/engines/hf_peft.py`, `threading.py`)."""
    files = [f[f.rfind("(") + 1 :].removeprefix("simplan/") for f in frames]  # simplan/: a frozen worktree's shim
    leaf = frames[-1] if frames else ""
    waiting = any(w in leaf for w in ("wait (threading.py", "_wait_for_tstate_lock", "get (queue.py", "select ("))
    mine = [f for f in files if f.startswith(SIMPLAN)]
    if thread == DISPATCHER:
        if any(f.startswith(("transformers/models/", "torch/nn/modules/")) for f in files):
            return "dispatcher", "model forward"
        if any(f.startswith("transformers/generation/") for f in files):
            return "dispatcher", "generate loop"
        if waiting or not any(f.startswith("inference/engines/") and "batching.py" not in f for f in mine):
            return "dispatcher", "idle"
        return "dispatcher", "engine python"
    if thread != "MainThread" and any(f.startswith(("inference/planning/", "evaluation/")) for f in mine):
        if any(f.startswith("inference/engines/batching.py") for f in mine):
            return "episode", "waiting for the model"
        if any(f.startswith(("envs/", "py4j/", "textworld_express/", "scienceworld/")) for f in files):
            return "episode", "env"
        return "episode", "idle" if waiting else "planner python"
    return "other", "idle" if waiting else "running"


def parse_raw(text: str) -> dict[str, Counter]:
    """Per thread, py-spy's raw lines (`thread (tid): name;frame;...;frame COUNT`) as class -> samples."""
    per_thread: dict[str, Counter] = defaultdict(Counter)
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *frames = stack.split(";")
        tid, _, name = head.partition(": ")
        role, cls = classify(name.strip(), frames)
        per_thread[f"{role}|{tid}"][cls] += int(count)
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


def children(pid: int) -> list[int]:
    """Direct children of `pid` (the JVMs py4j launched)."""
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


def cpu_window(start: dict[str, Any], end: dict[str, Any]) -> dict[str, float]:
    wall = end["time"] - start["time"]
    su, ss = (e - s for e, s in zip(end["self"], start["self"]))
    ku = sum(u - start["children"].get(k, (0.0, 0.0))[0] for k, (u, _) in end["children"].items())
    ks = sum(s - start["children"].get(k, (0.0, 0.0))[1] for k, (_, s) in end["children"].items())
    return {
        "wall_s": round(wall, 1),
        "eval_user_cores": round(su / wall, 3),
        "eval_system_cores": round(ss / wall, 3),
        "jvm_user_cores": round(ku / wall, 3),
        "jvm_system_cores": round(ks / wall, 3),
        "jvms": len(end["children"]),
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| thread | class | share of wall |", "|---|---|---:|"]
    for role in ("dispatcher", "episode"):
        for cls, share in sorted(result["shares"][role].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {role} | {cls} | {100 * share:.1f}% |")
    cpu = result["cpu"]
    lines.append("")
    lines.append(
        f"CPU over {cpu['wall_s']} s (cores busy on average): eval process user {cpu['eval_user_cores']}, "
        f"system {cpu['eval_system_cores']}; {cpu['jvms']} JVMs user {cpu['jvm_user_cores']}, "
        f"system {cpu['jvm_system_cores']}; load average before {result['load_before']}, after "
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
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    with open(out / "command.log", "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(args.warmup)
        start = cpu_snapshot(proc.pid)
        subprocess.run(
            [spy, "record", "--pid", str(proc.pid), "--rate", str(args.rate), "--duration", str(int(args.seconds))]
            + ["--threads", "--idle", "--nonblocking", "--format", "raw", "--output", str(out / "profile.raw")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
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
    result = {
        "command": command,
        "shares": {role: shares(per_thread, role) for role in ("dispatcher", "episode")},
        "episode_threads": sum(1 for k in per_thread if k.startswith("episode|")),
        "cpu": cpu_window(start, end),
        "load_before": " ".join(load_before),
        "load_after": " ".join(load_after),
    }
    (out / "profile.json").write_text(json.dumps(result, indent=2))
    (out / "profile.md").write_text(table(result) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

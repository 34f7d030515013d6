"""Misuse probes of the `simplan` command, as a new user would make them (issue 30's probe table).

    flock /tmp/heavy.lock .venv/bin/python bench/probe_misuse.py [--out runs/probes] [--only WORD]

Each probe runs `simplan ...` as a subprocess (fresh interpreter, its own working folder) under a timeout and is
classified:

    clean          the expected exit status, no "Traceback" in stderr, and the message names the file or field
    silent accept  exit 0 where an error was due
    crash          a Traceback on stderr, or exit 1 "failed:" (the boundary's word for an unexpected error) for
                   what is the user's mistake
    hang           over its timeout (or, for the memory probes, over their peak-memory bound: a runaway)
    lost           good lines given that were not written (import, validate, build, counterfactuals, traces,
                   eval resumed after Ctrl-C, train resumed past a torn checkpoint)
    doubled        a line, an episode or a metrics step written twice
    other          the expected class did not hold in another way (a wrong status, a message that names neither
                   the file nor the field): the JSON says which

Everything is model-free (engines `random` / `expert`, the `toy` env) except the torn-checkpoint probes, which
train a tiny random model made on the fly (models/tiny.py). Read-only and full disks are small tmpfs mounts
when the process may mount (root); as root `chmod 555` does not deny a write, so it is not used then. Prints the
table and writes every probe's result (argv, status, first stderr line, class) to OUT/probes.json.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLASSES = ("clean", "silent accept", "crash", "hang", "lost", "doubled", "other")
TIMEOUT = 60.0


@dataclass
class Outcome:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float
    timed_out: bool


@dataclass
class Probe:
    item: str  # issue 30 "Why" item (1-6) the probe belongs to
    group: str  # what is misused, e.g. "input/validate"
    name: str
    argv: list[str]
    status: int = 2  # the exit status a correct `simplan` gives
    words: tuple[str, ...] = ()  # what the message must say (the file, the field)
    forbid: tuple[str, ...] = ()  # what it must not say
    timeout: float = TIMEOUT
    max_peak_mb: float | None = None  # a runaway bound on the child's peak RSS
    check: Callable[[Outcome], tuple[str, str] | None] | None = None  # (class, why) when the work is wrong
    runner: Callable[[Probe], Outcome] | None = None  # a probe that is more than one command (Ctrl-C, resume)
    umask: int | None = None


# ---------------------------------------------------------------------------------------------- running
class Context:
    """The work folder of one probe run and the inputs every probe shares."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.n = 0
        self.env = {k: v for k, v in os.environ.items() if k not in ("SIMPLAN_DEBUG", "OMP_WAIT_POLICY")}
        self.env["PYTHONPATH"] = str(root / "plugins")
        self.env["TMPDIR"] = str(root / "tmp")  # the boundary's saved tracebacks stay in the work folder
        self.env["HF_HUB_OFFLINE"] = "1"
        (root / "tmp").mkdir()
        (root / "plugins").mkdir()

    def fresh(self, name: str) -> Path:
        """A new, empty folder for one probe."""
        self.n += 1
        path = self.root / "p" / f"{self.n:03d}-{name}"
        path.mkdir(parents=True)
        return path


def run_argv(
    ctx: Context, argv: list[str], timeout: float, cwd: Path | None = None, umask: int | None = None
) -> Outcome:
    """`simplan ARGV` in a fresh interpreter; its status, output, seconds and peak RSS (os.wait4)."""
    cwd = cwd or ctx.root
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "simplan.scripts.cli", *map(str, argv)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=cwd,
            env=ctx.env,
            start_new_session=True,
            preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
        )
        rc, usage, timed_out = wait(proc, timeout)
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return Outcome(
            rc, decode(out.read()), decode(err.read()), seconds, usage.ru_maxrss / 1024 if usage else 0.0, timed_out
        )


def decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def wait(proc: subprocess.Popen, timeout: float) -> tuple[int | None, object, bool]:
    """Wait for `proc` up to `timeout` s with os.wait4 (to read its peak RSS); kill its process group past it."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
            return rc, usage, False
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return None, usage, True
        time.sleep(0.02)


def classify(probe: Probe, o: Outcome) -> tuple[str, str]:
    """(class, why) of one probe's outcome."""
    text = o.stderr + o.stdout
    if o.timed_out:
        return "hang", f"over its {probe.timeout:.0f} s timeout"
    if probe.max_peak_mb is not None and o.peak_mb > probe.max_peak_mb:
        return "hang", f"runaway: peak RSS {o.peak_mb:.0f} MB > {probe.max_peak_mb:.0f} MB"
    if "Traceback" in o.stderr:
        return "crash", "a Traceback on stderr"
    if o.rc == 1 and "failed:" in o.stderr and probe.status != 1:
        return "crash", "exit 1 'failed:' for the user's mistake"
    if o.rc == 1 and "failed:" in o.stderr:
        return "crash", "exit 1 'failed:' (an unexpected error) where the input's problem was due"
    if o.rc == 0 and probe.status != 0:
        return "silent accept", f"exit 0 where {probe.status} was due"
    if probe.check is not None:
        try:
            verdict = probe.check(o)
        except Exception as e:  # a check that cannot read the output: the output is not what was due
            verdict = ("other", f"check failed: {type(e).__name__}: {e}")
        if verdict is not None:
            return verdict
    if o.rc != probe.status:
        return "other", f"exit {o.rc}, {probe.status} due"
    missing = [w for w in probe.words if w not in text]
    if missing:
        return "other", f"the message lacks {missing[0]!r}"
    present = [w for w in probe.forbid if w in text]
    if present:
        return "other", f"the message holds {present[0]!r}"
    return "clean", ""


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip() and "%|" not in line:  # progress bars are not a message
            return line.strip()[:300]
    return ""


# ---------------------------------------------------------------------------------------------- disks
@contextlib.contextmanager
def special_disks(root: Path) -> Iterator[dict[str, Path | None]]:
    """{"ro": a read-only folder, "full": a folder on a full disk} (None where this process cannot make one).

    A tmpfs remounted read-only gives EROFS and a 64 KiB tmpfs filled to the brim ENOSPC; both need mount
    rights (root). Without them a `chmod 555` folder stands for read-only when chmod denies this user a write."""
    disks: dict[str, Path | None] = {"ro": None, "full": None}
    mounted: list[Path] = []
    try:
        for kind in ("ro", "full"):
            point = root / f"disk-{kind}"
            point.mkdir()
            size = "64k"
            if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)]).returncode:
                continue
            mounted.append(point)
            (point / "data").mkdir()
            if kind == "ro":
                subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
            else:
                with contextlib.suppress(OSError), open(point / "data" / "filler", "wb") as f:
                    while True:
                        f.write(b"\0" * 4096)
                        f.flush()
            disks[kind] = point / "data"
        if disks["ro"] is None:
            folder = root / "chmod-555"
            folder.mkdir()
            folder.chmod(0o555)
            try:
                (folder / "x").write_text("x")
            except PermissionError:
                disks["ro"] = folder
        yield disks
    finally:
        for point in mounted:
            subprocess.run(["umount", str(point)])


# ---------------------------------------------------------------------------------------------- shared inputs
def sh(ctx: Context, *argv: str, timeout: float = 300) -> Outcome:
    o = run_argv(ctx, list(argv), timeout)
    if o.rc != 0:
        raise SystemExit(f"probe set-up failed: simplan {' '.join(argv)}\n{o.stderr[-3000:]}")
    return o


@dataclass
class Inputs:
    good: Path  # 3 good toy trajectory lines
    good_lines: list[str]
    chats: Path  # 2 good OpenAI-format chat lines
    chat_lines: list[str]
    run: Path  # an eval run folder of the random engine on toy-dev
    tiny: Path  # a tiny random model folder
    dataset: Path  # a decider dataset of the toy lines, tokenized for the tiny model
    trained: Path  # a train run of the tiny model with checkpoint-2 and checkpoint-4
    train_argv: list[str]
    bad: dict[str, bytes] = field(default_factory=dict)  # kind -> one bad line (no newline)


def make_inputs(ctx: Context) -> Inputs:
    root = ctx.root / "inputs"
    root.mkdir()
    good = root / "toy.jsonl"
    sh(ctx, "collect", "--env", "toy", "--fold", "train", "--policies", "expert", "--limit", "3", "--out", good,
       "--progress", "false", "--workers", "1")  # fmt: skip
    lines = good.read_text().splitlines()
    chats = root / "chats.jsonl"
    chat_lines = [
        json.dumps({"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "north"}]}),
        json.dumps({"messages": [{"role": "user", "content": "look"}, {"role": "assistant", "content": "south"}]}),
    ]
    chats.write_text("\n".join(chat_lines) + "\n")
    run = root / "eval-run"
    sh(
        ctx,
        "eval",
        "--suite",
        "toy-dev",
        "--engine",
        "random",
        "--arms",
        "reactive",
        "--out",
        run,
        "--progress",
        "false",
    )
    made = subprocess.run(
        [sys.executable, "-c", "from simplan.models.tiny import tiny_model; print(tiny_model('llama'))"],
        capture_output=True, text=True, env=ctx.env, check=True, timeout=600,
    )  # fmt: skip
    tiny = Path(made.stdout.strip().splitlines()[-1])
    dataset = root / "ds"
    sh(ctx, "build", "--role", "decider", "--inputs", good, "--out", dataset, "--model", tiny, "--progress", "false")
    trained = root / "train-run"
    train_argv = ["train", "--model", str(tiny), "--dataset", str(dataset), "--bf16", "false", "--report_to", "none",
                  "--lora_r", "8", "--per_device_train_batch_size", "1", "--learning_rate", "1e-3",
                  "--eval_steps", "0", "--save_steps", "2", "--logging_steps", "1", "--max_steps", "4",
                  "--num_threads", "1"]  # fmt: skip
    sh(ctx, *train_argv, "--output_dir", trained, timeout=600)
    record = json.loads(lines[0])
    record["success"] = float("nan")
    bad = {
        "invalid-utf8": lines[0].encode()[:30] + b"\xff\xfe" + lines[0].encode()[30:],
        "torn-json": lines[0].encode()[:60],
        "deeply-nested": b"[" * 20_000,
        "huge-integer": b"9" * 5000,
        "nan": json.dumps(record).encode(),  # NaN, as Python's json writes it
    }
    return Inputs(good, lines, chats, chat_lines, run, tiny, dataset, trained, train_argv, bad)


# ---------------------------------------------------------------------------------------------- checks
def line_count(path: Path) -> int:
    return len([line for line in path.read_text().splitlines() if line.strip()]) if path.exists() else 0


def count_check(path: Path, want: int, key: Callable[[dict], str] | None = None):
    """Lost when `path` holds fewer than `want` lines, doubled when a line (or its `key`) is there twice."""

    def check(o: Outcome) -> tuple[str, str] | None:
        rows = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        ids = [key(json.loads(r)) for r in rows] if key else rows
        if len(ids) != len(set(ids)):
            return "doubled", f"{len(ids) - len(set(ids))} line(s) written twice in {path.name}"
        if len(ids) < want:
            return "lost", f"{len(ids)} of {want} good lines written to {path.name}"
        return None

    return check


def build_check(out: Path, want: int):
    def check(o: Outcome) -> tuple[str, str] | None:
        md = (out / "stats.md").read_text()
        used = int(md.split("trajectories used: ")[1].split()[0])
        if used < want:
            return "lost", f"{used} of {want} good trajectories used"
        if used > want:
            return "doubled", f"{used} trajectories used of {want}"
        return None

    return check


# ---------------------------------------------------------------------------------------------- the probes
def input_probes(ctx: Context, inp: Inputs) -> list[Probe]:
    """Item 2 and 6: every bad input kind for validate, import, build, counterfactuals and traces, with the good
    lines around the bad one counted in what each writes."""
    probes: list[Probe] = []
    good_bytes = [line.encode() for line in inp.good_lines]
    chat_bytes = [line.encode() for line in inp.chat_lines]
    chat_bad = {
        "invalid-utf8": chat_bytes[0][:20] + b"\xff" + chat_bytes[0][20:],
        "torn-json": chat_bytes[0][:30],
        "deeply-nested": b"[" * 20_000,
        "huge-integer": chat_bytes[0].replace(b'"go"', b"9" * 5000),
        "nan": chat_bytes[0][:-1] + b', "success": NaN}',
        "deep-tool-arguments": json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "[" * 20_000}}],
                    },
                    {"role": "tool", "content": "r"},
                ]
            }
        ).encode(),
    }

    def write(folder: Path, name: str, data: bytes) -> Path:
        path = folder / name
        path.write_bytes(data)
        return path

    for command in ("validate", "import", "build", "counterfactuals", "traces"):
        lines = chat_bytes if command == "import" else good_bytes
        bads = chat_bad if command == "import" else inp.bad
        for kind in ("missing", "empty", "blank", "bom", *bads):
            d = ctx.fresh(f"{command}-{kind}")
            if command == "traces":  # the input is an eval run folder; its traces.jsonl is what is misused
                run = d / "run"
                shutil.copytree(inp.run, run)
                trace_lines = (run / "traces.jsonl").read_bytes().splitlines()
                target = run / "traces.jsonl"
                data = {
                    "missing": None,
                    "empty": b"",
                    "blank": b"\n  \n",
                    "bom": b"\xef\xbb\xbf" + b"\n".join(trace_lines) + b"\n",
                }.get(kind)
                if kind == "missing":
                    shutil.rmtree(run)
                elif data is None:  # a bad line in the middle of good ones: the torn one last, as a kill leaves it
                    cut = len(trace_lines) // 2
                    order = [*trace_lines[:cut], bads[kind], *trace_lines[cut:]]
                    if kind == "torn-json":
                        order = [*trace_lines, bads[kind]]
                    data = b"\n".join(order) + (b"" if kind == "torn-json" else b"\n")
                if data is not None:
                    target.write_bytes(data)
                out = d / "traces-out.jsonl"
                argv = ["traces", "--runs", run, "--out", out]
                bad_at = f"{target}:" if kind not in ("missing", "empty", "blank", "bom") else str(run)
                # a torn last line is what a killed eval leaves, and traces skips it by design (naming it)
                status = {"missing": 2, "empty": 2, "blank": 2, "bom": 0, "torn-json": 0}.get(kind, 1)
                words = (bad_at,) if kind != "bom" else ()
                check = None
                if kind not in ("missing", "empty", "blank"):
                    check = count_check(out, 2, key=lambda r: r.get("id") or r["task"]["task_id"])  # the 2 won eps
                probes.append(Probe("6" if kind in ("empty", "blank", "bom", "nan") else "2", f"input/{command}", kind,
                                    argv, status, words, ("at at",), check=check))  # fmt: skip
                continue
            if kind == "missing":
                path = d / "gone.jsonl"
            elif kind == "empty":
                path = write(d, "empty.jsonl", b"")
            elif kind == "blank":
                path = write(d, "blank.jsonl", b"\n  \n\t\n")
            elif kind == "bom":
                path = write(d, "bom.jsonl", b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
            elif kind == "torn-json":  # what a killed writer leaves: the last line cut, no newline
                path = write(d, "in.jsonl", b"\n".join([*lines, bads[kind]]))
            else:
                path = write(d, "in.jsonl", b"\n".join([*lines[:1], bads[kind], *lines[1:]]) + b"\n")
            bad_line = len(lines) + 1 if kind == "torn-json" else 2
            named = f"{path}:{bad_line}:" if kind not in ("missing", "empty", "blank", "bom") else str(path)
            item = "6" if kind in ("empty", "blank", "bom", "nan") else "2"
            is_bad_line = kind not in ("missing", "empty", "blank", "bom")
            want = len(lines)
            if command == "validate":
                probes.append(Probe(item, "input/validate", kind, ["validate", path],
                                    0 if kind == "bom" else (1 if is_bad_line else 2),
                                    () if kind == "bom" else (named,), ("at at",)))  # fmt: skip
                if is_bad_line or kind == "bom":  # --keep-going splits good from bad: none of the good lost
                    out, rej = d / "good.jsonl", d / "bad.jsonl"
                    probes.append(Probe(item, "input/validate", f"{kind} --keep-going",
                                        ["validate", path, "--keep-going", "--out", out, "--rejects", rej],
                                        1 if is_bad_line else 0, (named,) if is_bad_line else (),
                                        check=count_check(out, want)))  # fmt: skip
            elif command == "import":
                out = d / "imported.jsonl"
                probes.append(Probe(item, "input/import", kind, ["import", "--format", "openai", path, "--out", out],
                                    0 if kind == "bom" else (1 if is_bad_line else 2),
                                    () if kind == "bom" else (named,), ("at at",),
                                    check=count_check(out, want) if is_bad_line or kind == "bom" else None),
                                    )  # fmt: skip
            elif command == "build":
                out = d / "ds"
                probes.append(Probe(item, "input/build", kind,
                                    ["build", "--inputs", path, "--out", out, "--progress", "false"],
                                    0 if kind == "bom" else 2, () if kind == "bom" else (named,), ("at at",),
                                    check=build_check(out, want) if kind == "bom" else None))  # fmt: skip
                if is_bad_line:
                    out = d / "ds-kept"
                    probes.append(Probe(item, "input/build", f"{kind} --keep_going",
                                        ["build", "--inputs", path, "--out", out, "--keep_going", "true",
                                         "--progress", "false"], 0, (named,),
                                        check=build_check(out, want)))  # fmt: skip
            elif command == "counterfactuals":
                out = d / "cf.jsonl"
                probes.append(Probe(item, "input/counterfactuals", kind,
                                    ["counterfactuals", "--inputs", path, "--out", out, "--progress", "false"],
                                    0 if kind == "bom" else (1 if is_bad_line else 2),
                                    () if kind == "bom" else (named,), ("at at",),
                                    check=count_check(out, want) if is_bad_line or kind == "bom" else None),
                                    )  # fmt: skip
    return probes


def out_probes(ctx: Context, inp: Inputs, disks: dict[str, Path | None]) -> list[Probe]:
    """Item 5: an output that is a file (or a folder where a file is due), under a file, read-only, on a full disk,
    for every command that writes one. Each is checked before the work (the engine, the model) starts."""
    hf = ["--engine", "hf", "--model", inp.tiny]
    # command -> (argv before the output flag, the output flag, "file" or "folder")
    commands: dict[str, tuple[list, str, str]] = {
        "collect": (["collect", "--env", "toy", "--fold", "train", "--limit", "1", "--progress", "false"], "--out",
                    "file"),
        "import": (["import", "--format", "openai", inp.chats], "--out", "file"),
        "validate": (["validate", inp.good, "--keep-going"], "--out", "file"),
        "counterfactuals": (["counterfactuals", "--inputs", inp.good, "--progress", "false"], "--out", "file"),
        "traces": (["traces", "--runs", inp.run], "--out", "file"),
        "run": (["run", "--env", "toy", "--task", "corridor-0", "--fold", "train", "--engine", "random",
                 "--view", "none"],
                "--trace", "file"),
        "build": (["build", "--inputs", inp.good, "--progress", "false"], "--out", "folder"),
        "report": (["report", inp.run], "--out", "folder"),
        "eval": (["eval", "--suite", "toy-dev", *hf, "--progress", "false"], "--out", "folder"),
        "train": ([*inp.train_argv], "--output_dir", "folder"),
        "eval-model": (["eval-model", "--role", "decider", "--dataset", inp.dataset, "--model", inp.tiny,
                        "--fold", "train"],
                       "--out", "folder"),
        "fit-judge": (["fit-judge", "--inputs", inp.good, *hf], "--out", "folder"),
        "pipeline": (["pipeline", "--config", REPO / "recipes/pipeline/toy-tiny.yaml"], "--out", "folder"),
        "flywheel": (["flywheel", "--config", REPO / "recipes/pipeline/flywheel-twx.yaml"], "--out", "folder"),
    }  # fmt: skip
    probes = []
    for command, (argv, flag, kind) in commands.items():
        for misuse in ("wrong kind", "under a file", "read-only", "full disk"):
            d = ctx.fresh(f"out-{command}-{misuse.replace(' ', '-')}")
            a_file = d / "notes.txt"
            a_file.write_text("mine\n")
            if misuse == "wrong kind":
                target, words = (
                    (a_file, (f"{flag} {a_file}", "is a file")) if kind == "folder" else (d, (str(d), "folder"))
                )
                name = "a file where a folder is due" if kind == "folder" else "a folder where a file is due"
            elif misuse == "under a file":
                target, words, name = (
                    a_file / ("out" if kind == "folder" else "out.jsonl"),
                    (str(a_file), "is a file"),
                    misuse,
                )
            else:
                disk = disks["ro" if misuse == "read-only" else "full"]
                if disk is None:
                    continue
                target = disk / f"{command}-out" / ("" if kind == "folder" else "out.jsonl")
                target = Path(str(target).rstrip("/"))
                words = (str(disk), "read-only" if misuse == "read-only" else "no space left")
                name = misuse
            check = None
            if misuse != "read-only":

                def check(o: Outcome, a_file=a_file) -> tuple[str, str] | None:
                    if a_file.read_text() != "mine\n":
                        return "lost", f"{a_file} was overwritten"
                    return None

            probes.append(Probe("5", f"out/{command}", name, [*argv, flag, target], 2, words, check=check,
                                timeout=120))  # fmt: skip
    return probes


def config_probes(ctx: Context, inp: Inputs) -> list[Probe]:
    """Items 5 and 6: --config missing, not YAML, a list, with an unknown key; typed values given as strings."""
    probes = []
    commands = ["train", "build", "pipeline", "eval", "collect", "import", "counterfactuals", "traces", "eval-model",
                "fit-judge", "run", "flywheel"]  # fmt: skip
    d = ctx.fresh("configs")
    missing = d / "missing.yaml"
    not_yaml = d / "broken.yaml"
    not_yaml.write_text("role: decider\ninputs: [a.jsonl\n")
    a_list = d / "list.yaml"
    a_list.write_text("- 1\n- 2\n")
    unknown = d / "unknown.yaml"
    unknown.write_text("no_such_key: 1\n")
    scalar = d / "scalar.yaml"
    scalar.write_text("just some words\n")
    for command in commands:
        item = "5" if command in ("train", "build", "pipeline") else "6"
        pre = [command, inp.chats] if command == "import" else [command]  # import's input is positional
        probes += [
            Probe(item, f"config/{command}", "missing file", [*pre, "--config", missing], 2, (str(missing),)),
            Probe("5", f"config/{command}", "not YAML", [*pre, "--config", not_yaml], 2, (str(not_yaml), "YAML")),
            Probe("5", f"config/{command}", "a list", [*pre, "--config", a_list], 2, (str(a_list), "mapping")),
            Probe("5", f"config/{command}", "a scalar", [*pre, "--config", scalar], 2, (str(scalar), "mapping")),
            Probe("6", f"config/{command}", "an unknown key", [*pre, "--config", unknown], 2, ("no_such_key",)),
        ]

    def recipe(name: str, text: str) -> Path:
        path = d / name
        path.write_text(text)
        return path

    # typed values: YAML 1.1 reads 1e-4 as a string; a string where a list or a number is due
    gone = d / "no-such-dataset"
    probes += [
        Probe("6", "config/train", "learning_rate: 1e-4 (a YAML string)",
              ["train", "--config", recipe("t1.yaml", f"learning_rate: 1e-4\ndataset: {gone}\n")], 2, (str(gone),)),
        Probe("6", "config/train", "learning_rate: '3e-3' quoted",
              ["train", "--config", recipe("t2.yaml", f"learning_rate: '3e-3'\ndataset: {gone}\n")], 2, (str(gone),)),
        Probe("6", "config/train", "max_steps: two",
              ["train", "--config", recipe("t3.yaml", f"max_steps: two\ndataset: {inp.dataset}\n")], 2,
              ("max_steps", "two")),
        Probe("6", "config/train", "lora_target_modules: q_proj (a string for a list)",
              ["train", "--config", recipe("t4.yaml", f"lora_target_modules: {{q: 1}}\ndataset: {gone}\n")], 2,
              ("lora_target_modules",)),
        Probe("6", "config/build", "max_prompt_tokens: lots",
              ["build", "--config", recipe("b1.yaml", f"inputs: {inp.good}\nmax_prompt_tokens: lots\n"),
               "--out", d / "b1"], 2, ("max_prompt_tokens", "lots")),
        Probe("6", "config/build", "inputs: one path as a string (not a list)",
              ["build", "--config", recipe("b2.yaml", f"inputs: {inp.good}\nmax_prompt_tokens: '512'\n"),
               "--out", d / "b2", "--progress", "false"], 0, check=build_check(d / "b2", 3)),
        Probe("6", "config/eval", "arms: reactive (a string for a list)",
              ["eval", "--config", recipe("e1.yaml", "suite: toy-dev\narms: reactive\nengine: random\n"),
               "--out", d / "e1", "--progress", "false"], 0,
              check=lambda o: None if {json.loads(r)["arm"] for r in (d / "e1/results.jsonl").read_text().splitlines()}
              == {"reactive"} else ("other", "arms split into letters")),
        Probe("6", "config/eval", "arms: {reactive: 1}",
              ["eval", "--config", recipe("e2.yaml", "suite: toy-dev\narms: {reactive: 1}\nengine: random\n"),
               "--out", d / "e2"], 2, ("arms",)),
        Probe("6", "config/eval", "episodes: many",
              ["eval", "--config", recipe("e3.yaml", "suite: toy-dev\nepisodes: many\nengine: random\n"),
               "--out", d / "e3"], 2, ("episodes", "many")),
        Probe("6", "config/collect", "limit: two",
              ["collect", "--config", recipe("c1.yaml", "env: toy\nfold: train\nlimit: two\n"),
               "--out", d / "c1.jsonl"],
              2, ("limit", "two")),
        Probe("6", "config/collect", "limit: '2' and policies: expert (strings)",
              ["collect", "--config", recipe("c2.yaml", "env: toy\nfold: train\nlimit: '2'\npolicies: expert\n"),
               "--out", d / "c2.jsonl", "--progress", "false"], 0, check=count_check(d / "c2.jsonl", 2)),
        Probe("6", "config/pipeline", "force: maybe",
              ["pipeline", "--config", recipe("p1.yaml", "env: toy\nforce: maybe\n"), "--out", d / "p1"], 2,
              ("force", "maybe")),
    ]  # fmt: skip
    return probes


def flag_probes(ctx: Context, inp: Inputs) -> list[Probe]:
    """Items 5 and 6: --planner and other YAML flags malformed, a missing model folder, an env that is no env,
    unknown flags and values of the wrong type."""
    probes = []
    d = ctx.fresh("flags")
    toy_run = ["run", "--env", "toy", "--task", "corridor-0", "--fold", "train", "--engine", "random",
               "--view", "none",
               "--trace", d / "run-trace.jsonl"]  # fmt: skip
    toy_eval = ["eval", "--suite", "toy-dev", "--engine", "random", "--out", d / "ev", "--progress", "false"]
    for planner, words in (
        ("{horizon: 2", ("planner", "YAML")),
        ("[1,2]", ("planner", "mapping")),
        ("42", ("planner", "mapping")),
        ("{horizon: two}", ("horizon", "two")),
        ("{no_such_key: 1}", ("no_such_key",)),
        ("{budgets: [1]}", ("budgets",)),
    ):
        probes.append(Probe("5", "flags/eval", f"--planner {planner!r}", [*toy_eval, "--planner", planner], 2, words))
    probes += [
        Probe("5", "flags/run", "--horizon two", [*toy_run, "--horizon", "two"], 2, ("horizon", "two")),
        Probe("5", "flags/run", "--budgets '{max_steps: '", [*toy_run, "--budgets", "{max_steps: "], 2, ("budgets",)),
        Probe("5", "flags/run", "--budgets '[1]'", [*toy_run, "--budgets", "[1]"], 2, ("budgets",)),
        Probe("5", "flags/eval", "--arm_overrides '{simplan: [1]}'", [*toy_eval, "--arm_overrides", "{simplan: [1]}"],
              2, ("simplan",)),
        Probe("5", "flags/eval", "--arm_overrides '{nosuch: {k: 1}}'",
              [*toy_eval, "--arm_overrides", "{nosuch: {k: 1}}"], 2, ("nosuch",)),
        Probe("5", "flags/eval", "--faults '{transient: 2}'", [*toy_eval, "--faults", "{transient: 2}"], 2,
              ("transient",)),
        Probe("5", "flags/eval", "--arms nosuch", [*toy_eval, "--arms", "nosuch"], 2, ("nosuch",)),
        Probe("5", "flags/eval", "--suite nosuch",
              ["eval", "--suite", "nosuch", "--engine", "random", "--out", d / "s"],
              2, ("nosuch",)),
        Probe("5", "flags/eval", "--engine nosuch", ["eval", "--suite", "toy-dev", "--engine", "nosuch", "--out",
                                                     d / "en"], 2, ("nosuch",)),
        Probe("5", "flags/run", "--engine nosuch", [*toy_run[:-4], "--view", "none", "--engine", "nosuch"], 2,
              ("nosuch",)),
        Probe("5", "flags/eval", "--adapters decider (no =PATH)",
              ["eval", "--suite", "toy-dev", "--engine", "hf", "--model", inp.tiny, "--adapters", "decider",
               "--out", d / "ad"], 2, ("adapters", "decider")),
        Probe("5", "flags/eval", "--adapters decider=missing-folder",
              ["eval", "--suite", "toy-dev", "--engine", "hf", "--model", inp.tiny, "--adapters",
               f"decider={d / 'no-adapter'}", "--out", d / "ad2", "--progress", "false"], 2, (str(d / "no-adapter"),),
              timeout=120),
    ]  # fmt: skip
    for opt in ("{max_rooms: ", "{no_such: 1}", "[1]"):
        words = ("env_kwargs",) if opt != "{no_such: 1}" else ("no_such",)
        probes += [
            Probe("5", "flags/collect", f"--env_kwargs {opt!r}",
                  ["collect", "--env", "toy", "--fold", "train", "--limit", "1", "--env_kwargs", opt, "--out",
                   d / "k.jsonl", "--progress", "false"], 2, words),
            Probe("5", "flags/run", f"--env_kwargs {opt!r}", [*toy_run, "--env_kwargs", opt], 2, words),
            Probe("5", "flags/counterfactuals", f"--env_kwargs {opt!r}",
                  ["counterfactuals", "--inputs", inp.good, "--env_kwargs", opt, "--out", d / "cf.jsonl",
                   "--progress", "false"], 2, words),
        ]  # fmt: skip

    # --engine hf --model missing-folder: named before anything loads
    gone = d / "missing-model"
    probes += [
        Probe("5", "model/eval", "--engine hf --model missing-folder",
              ["eval", "--suite", "toy-dev", "--engine", "hf", "--model", gone, "--out", d / "m1"], 2, (str(gone),)),
        Probe("5", "model/run", "--engine hf --model missing-folder",
              [*toy_run[:7], "--view", "none", "--engine", "hf", "--model", gone], 2, (str(gone),)),
        Probe("5", "model/fit-judge", "--engine hf --model missing-folder",
              ["fit-judge", "--inputs", inp.good, "--engine", "hf", "--model", gone, "--out", d / "m3"], 2,
              (str(gone),)),
        Probe("5", "model/eval-model", "--model missing-folder",
              ["eval-model", "--role", "decider", "--dataset", inp.dataset, "--fold", "train", "--model", gone,
               "--out", d / "m4"], 2,
              (str(gone),)),
        Probe("5", "model/train", "--model missing-folder",
              ["train", "--model", gone, "--dataset", inp.dataset, "--output_dir", d / "m5"], 2, (str(gone),)),
        Probe("5", "model/build", "--model missing-folder",
              ["build", "--inputs", inp.good, "--model", gone, "--out", d / "m6"], 2, (str(gone),)),
        Probe("5", "model/models", "models fetch missing-folder", ["models", "fetch", gone], 2, (str(gone),)),
    ]  # fmt: skip

    # --env that is no env: a plain function, a factory returning an int, unknown names
    (ctx.root / "plugins" / "myfactory.py").write_text("def make(**kwargs):\n    return 3\n")
    envs = {
        "json:loads": "json:loads",
        "a factory returning an int": "myfactory:make",
        "an unknown env": "nosuch",
        "a module that is not there": "nosuch_module_x:Env",
        "an attribute that is not there": "json:NoSuchEnv",
    }
    suites = {}
    for what, env in envs.items():
        suite = d / f"suite-{len(suites)}.yaml"
        suite.write_text(
            f"name: s\nmax_steps: 5\nentries:\n  - env: {env!r}\n    fold: dev\n    tasks_per_family: 1\n"
        )
        suites[what] = suite
    for what, env in envs.items():
        probes += [
            Probe("5", "env/collect", what, ["collect", "--env", env, "--fold", "train", "--out", d / "e.jsonl"], 2,
                  (env,)),
            Probe("5", "env/run", what, ["run", "--env", env, "--task", "t-1", "--engine", "random", "--view", "none",
                                         "--trace", d / "t.jsonl"], 2, (env,)),
            Probe("5", "env/envs check", what, ["envs", "check", env], 2, (env,)),
            Probe("5", "env/eval", what + " (in a suite)", ["eval", "--suite", suites[what], "--engine", "random",
                                                            "--out", d / f"ev-{len(probes)}"], 2, (env,)),
        ]  # fmt: skip
    probes.append(Probe("5", "env/pipeline", "an unknown env", ["pipeline", "--env", "nosuch", "--out", d / "pl"], 2,
                        ("nosuch",)))  # fmt: skip

    # unknown flags, unknown subcommands, values of the wrong type
    for command in ("envs", "collect", "counterfactuals", "import", "validate", "build", "models", "train",
                    "eval-model", "fit-judge", "serve", "run", "eval", "traces", "report", "pipeline",
                    "flywheel"):  # fmt: skip
        pre = {"models": ["models", "list"], "report": ["report", inp.run, "--out", d / "rep"]}.get(command, [command])
        probes.append(Probe("5", "flags/unknown", command, [*pre, "--no_such_flag", "1"], 2, ("no_such_flag",)))
    probes += [
        Probe("5", "flags/unknown", "simplan nosuch (command)", ["nosuch"], 2, ("nosuch",)),
        Probe("5", "flags/unknown", "envs nosuch", ["envs", "nosuch"], 2, ("nosuch",)),
        Probe("5", "flags/unknown", "models nosuch", ["models", "nosuch"], 2, ("nosuch",)),
        Probe("5", "flags/type", "collect --limit abc", ["collect", "--env", "toy", "--limit", "abc"], 2,
              ("limit", "abc")),
        Probe("5", "flags/type", "eval --episodes x", [*toy_eval, "--episodes", "x"], 2, ("episodes",)),
        Probe("5", "flags/type", "eval --concurrency 0", [*toy_eval, "--concurrency", "0"], 2, ("concurrency",)),
        Probe("5", "flags/type", "build --role nosuch", ["build", "--role", "nosuch", "--inputs", inp.good, "--out",
                                                         d / "r"], 2, ("role", "nosuch")),
        Probe("5", "flags/type", "train --max_steps x", ["train", "--dataset", inp.dataset, "--max_steps", "x"],
              2, ("max_steps",)),
        Probe("5", "flags/type", "run --view nosuch", [*toy_run, "--view", "nosuch"], 2, ("view", "nosuch")),
        Probe("5", "flags/type", "validate --max-problems x", ["validate", inp.good, "--max-problems", "x"], 2,
              ("max-problems",)),
        Probe("5", "flags/type", "collect --fold nosuch", ["collect", "--env", "toy", "--fold", "nosuch", "--out",
                                                           d / "f.jsonl"], 2, ("nosuch",)),
        Probe("6", "flags/serve", "serve --api-key on the command line", ["serve", "--api-key", "k", "--no-such-flag"],
              2, ("ps", "SIMPLAN_API_KEY")),
    ]  # fmt: skip
    return probes


# ---------------------------------------------------------------------------------------------- Ctrl-C and resume
SLOW_TOY = '''"""The toy env, 0.1 s a step: long enough episodes to interrupt."""
import time
from simplan.envs.toy import ToyEnv


class SlowToy(ToyEnv):
    name = "slowtoy"

    def step(self, action):
        time.sleep(0.1)
        return super().step(action)
'''


def sigint_probes(ctx: Context) -> list[Probe]:
    """Item 4: SIGINT (as a terminal's Ctrl-C: to the process group) to `simplan eval --engine random` on a slow
    toy env with 4 episodes at once; exit 130 within the bound; a rerun resumes: every planned episode ends once
    in results.jsonl and traces.jsonl, none lost or doubled."""
    (ctx.root / "plugins" / "slowtoy.py").write_text(SLOW_TOY)
    suite = ctx.root / "plugins" / "slow-toy.yaml"
    suite.write_text("name: slow-toy\nmax_steps: 8\nentries:\n  - env: slowtoy:SlowToy\n    fold: dev\n"
                     "    tasks_per_family: 8\n")  # fmt: skip
    probes = []
    trials = [(delay, 1) for delay in (0.8, 1.2, 1.6, 2.0, 2.4, 2.8)] + [(1.2, 2), (2.0, 2)]
    for delay, signals in trials:
        d = ctx.fresh(f"sigint-{delay}-{signals}")
        argv = ["eval", "--suite", suite, "--engine", "random", "--arms", "reactive", "--repeats", "2",
                "--concurrency", "4",
                "--out", d / "ev", "--progress", "false"]  # fmt: skip
        bound = 2.0 if signals == 1 else 1.5  # one episode is at most 8 steps x 0.1 s
        probes.append(Probe("4", "signal/eval", f"SIGINT x{signals} at {delay} s, then a rerun", argv, 130,
                            ("interrupted",), timeout=90,
                            runner=lambda p, d=d, delay=delay, signals=signals, bound=bound:
                            interrupt_and_resume(ctx, p, d / "ev", delay, signals, bound)))  # fmt: skip
    return probes


def default_sigint() -> None:
    """A job started in the background (`cmd &`) inherits SIGINT ignored, and Python then installs no handler: give
    the child the default, as a terminal's foreground job has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_and_resume(ctx: Context, probe: Probe, out: Path, delay: float, signals: int, bound: float) -> Outcome:
    env = ctx.env
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "simplan.scripts.cli", *map(str, probe.argv)], stdout=so,
                                stderr=se, cwd=ctx.root, env=env, start_new_session=True,
                                preexec_fn=default_sigint)  # fmt: skip
        time.sleep(delay)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        if signals == 2:
            time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGINT)
        rc, usage, timed_out = wait(proc, probe.timeout)
        stopped = time.monotonic() - sent
        so.seek(0)
        se.seek(0)
        first = Outcome(rc, decode(so.read()), decode(se.read()), time.monotonic() - start, 0.0, timed_out)
    if timed_out:
        return first
    if stopped > bound:
        first.timed_out = True
        probe.timeout = bound
        first.stderr += f"\n(probe: stopped {stopped:.1f} s after the first SIGINT, bound {bound} s)"
        return first
    again = run_argv(ctx, probe.argv, probe.timeout)
    first.stderr += f"\n(probe: stopped {stopped:.2f} s after SIGINT; rerun exit {again.rc})"
    if again.rc != 0 or "Traceback" in again.stderr:
        first.stderr += "\n" + again.stderr

    def check(o: Outcome) -> tuple[str, str] | None:
        if again.rc != 0:
            return "other", f"the rerun exited {again.rc}: {first_line(again.stderr)}"
        done = [json.loads(r)["episode_id"] for r in (out / "results.jsonl").read_text().splitlines() if r.strip()]
        ends = [json.loads(r)["episode_id"] for r in (out / "traces.jsonl").read_text().splitlines()
                if r.strip() and '"type": "end"' in r]  # fmt: skip
        for what, ids in (("results.jsonl", done), ("traces.jsonl ends", ends)):
            if len(ids) != len(set(ids)):
                return "doubled", f"{len(ids) - len(set(ids))} episode(s) twice in {what}"
            if len(set(ids)) < 16:
                return "lost", f"{len(set(ids))} of 16 episodes in {what}"
        return None

    probe.check = check
    return first


# ---------------------------------------------------------------------------------------------- torn checkpoints
def torn_probes(ctx: Context, inp: Inputs) -> list[Probe]:
    """Item 1: the newest checkpoint cut short in the ways a SIGKILL or a full disk leaves it; the rerun resumes from
    the intact one, moves the torn one aside, logs no step twice."""
    cases = {
        "adapter_model.safetensors cut in half": ("adapter_model.safetensors", "half"),
        "optimizer.pt cut in half": ("optimizer.pt", "half"),
        "optimizer.pt empty": ("optimizer.pt", "empty"),
        "trainer_state.json missing": ("trainer_state.json", "delete"),
        "only the adapter files written": ("", "adapter-only"),
    }
    probes = []
    for name, (file, how) in cases.items():
        d = ctx.fresh("torn")
        run = d / "run"
        shutil.copytree(inp.trained, run)
        ck = run / "checkpoint-4"
        if how == "half":
            os.truncate(ck / file, (ck / file).stat().st_size // 2)
        elif how == "empty":
            os.truncate(ck / file, 0)
        elif how == "delete":
            (ck / file).unlink()
        else:
            for f in ck.iterdir():
                if not f.name.startswith("adapter_"):
                    f.unlink()
        # the rerun asks for 6 steps: 2 more than the torn run had
        argv = [*[a if a != "4" else "6" for a in inp.train_argv], "--output_dir", run]

        def check(o: Outcome, run=run) -> tuple[str, str] | None:
            steps = [json.loads(r).get("step") for r in (run / "metrics.jsonl").read_text().splitlines() if r.strip()]
            steps = [s for s, r in zip(steps, (run / "metrics.jsonl").read_text().splitlines()) if '"loss"' in r]
            if len(steps) != len(set(steps)):
                return "doubled", f"metrics steps logged twice: {sorted(steps)}"
            if sorted(steps) != list(range(1, 7)):
                return "lost", f"metrics steps {sorted(steps)}, 1-6 due"
            if not (run / "torn-checkpoint-4").is_dir():
                return "other", "the torn checkpoint was not moved aside"
            return None

        probes.append(Probe("1", "resume/train", name, argv, 0, ("resuming from checkpoint-2",), timeout=300,
                            check=check))  # fmt: skip
    return probes


# ---------------------------------------------------------------------------------------------- memory and the rest
def memory_probes(ctx: Context, inp: Inputs) -> list[Probe]:
    """Item 3: one 50 MB observation: each command's peak memory stays bounded and the observation is capped."""
    d = ctx.fresh("memory")
    record = json.loads(inp.good_lines[0])
    record["steps"][0]["observation"] = "x" * 50_000_000
    big = d / "big.jsonl"
    big.write_text("\n".join([json.dumps(record), *inp.good_lines[1:]]) + "\n")
    chat = d / "big-chat.jsonl"
    chat.write_text(
        json.dumps(
            {"messages": [{"role": "user", "content": "x" * 50_000_000}, {"role": "assistant", "content": "a"}]}
        )
        + "\n"
    )
    bound = 1500.0  # MB; issue 30 saw 3 GB for build
    return [
        Probe("3", "memory/build", "decider, a 50 MB observation",
              ["build", "--role", "decider", "--inputs", big, "--out", d / "dd", "--progress", "false"], 0,
              max_peak_mb=bound, timeout=120, check=build_check(d / "dd", 3)),
        Probe("3", "memory/build", "simulator, a 50 MB observation",
              ["build", "--role", "simulator", "--inputs", big, "--out", d / "ds", "--progress", "false"], 0,
              max_peak_mb=bound, timeout=120, check=build_check(d / "ds", 3)),
        Probe("3", "memory/validate", "a 50 MB observation", ["validate", big], 0, max_peak_mb=bound, timeout=120),
        Probe("3", "memory/import", "a 50 MB user message",
              ["import", "--format", "openai", chat, "--out", d / "i.jsonl"], 0, max_peak_mb=bound, timeout=120,
              check=lambda o: None if (d / "i.jsonl").stat().st_size < 5_000_000
              else ("other", "the 50 MB message was not capped")),
    ]  # fmt: skip


UNGUARDED = """import json
from simplan.data.collect import CollectConfig, collect
report = collect(CollectConfig(env='toy', fold='train', policies=['expert'], limit=2, workers=2, out={out!r},
                               progress=False))
print(json.dumps({{'written': report.written, 'unfinished': report.unfinished}}))
"""


def misc_probes(ctx: Context, inp: Inputs) -> list[Probe]:
    """Item 6: files and folders follow the umask; a user script without a __main__ guard collects with workers."""
    d = ctx.fresh("umask")

    def modes(o: Outcome) -> tuple[str, str] | None:
        f = (d / "c.jsonl").stat().st_mode & 0o777
        return None if f == 0o644 else ("other", f"collect wrote a {oct(f)} file under umask 022")

    def folder_modes(o: Outcome) -> tuple[str, str] | None:
        m = (d / "ds").stat().st_mode & 0o777
        return None if m == 0o755 else ("other", f"build made a {oct(m)} folder under umask 022")

    script = d / "collect_at_module_level.py"
    script.write_text(UNGUARDED.format(out=str(d / "u.jsonl")))

    def unguarded(p: Probe) -> Outcome:
        start = time.monotonic()
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=d, env=ctx.env,
                              timeout=p.timeout)  # fmt: skip
        return Outcome(done.returncode, done.stdout, done.stderr, time.monotonic() - start, 0.0, False)

    return [
        Probe("6", "umask/collect", "a file under umask 022",
              ["collect", "--env", "toy", "--fold", "train", "--limit", "1", "--out", d / "c.jsonl", "--progress",
               "false"], 0, umask=0o022, check=modes),
        Probe("6", "umask/build", "a folder under umask 022",
              ["build", "--inputs", inp.good, "--out", d / "ds", "--progress", "false"], 0, umask=0o022,
              check=folder_modes),
        Probe("6", "script/collect", "a script without a __main__ guard, --workers 2", [str(script)], 0,
              timeout=180, runner=unguarded, check=count_check(d / "u.jsonl", 2)),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------- report
def table(results: list[dict]) -> str:
    def row(label: str, rows: list[dict]) -> str:
        c = collections.Counter(r["class"] for r in rows)
        return f"| {label} | {len(rows)} | " + " | ".join(str(c[k]) for k in CLASSES) + " |"

    head = "| probes | tried | " + " | ".join(CLASSES) + " |\n|---|---:|" + "---:|" * len(CLASSES)
    lines = [head, row("all", results)]
    for item in sorted({r["item"] for r in results}):
        lines.append(row(f"issue 30 item {item}", [r for r in results if r["item"] == item]))
    groups = collections.defaultdict(list)
    for r in results:
        groups[r["group"].split("/")[0]].append(r)
    lines += [row(f"{g} (group)", rows) for g, rows in sorted(groups.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/probes", help="folder for probes.json and table.md")
    parser.add_argument("--only", default="", help="run only probes whose group or name holds this word")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="simplan-probes-"))
    started = time.monotonic()
    try:
        ctx = Context(root)
        with special_disks(root) as disks:
            inp = make_inputs(ctx)
            print(f"inputs ready in {time.monotonic() - started:.0f} s (work folder {root})", flush=True)
            probes = [
                *input_probes(ctx, inp),
                *out_probes(ctx, inp, disks),
                *config_probes(ctx, inp),
                *flag_probes(ctx, inp),
                *sigint_probes(ctx),
                *torn_probes(ctx, inp),
                *memory_probes(ctx, inp),
                *misc_probes(ctx, inp),
            ]
            probes = [p for p in probes if args.only in p.group or args.only in p.name]
            results = []
            for i, p in enumerate(probes, 1):
                o = p.runner(p) if p.runner else run_argv(ctx, p.argv, p.timeout, umask=p.umask)
                cls, why = classify(p, o)
                results.append(
                    {
                        "item": p.item,
                        "group": p.group,
                        "name": p.name,
                        "argv": ["simplan", *map(str, p.argv)],
                        "status": o.rc,
                        "expected_status": p.status,
                        "seconds": round(o.seconds, 2),
                        "peak_mb": round(o.peak_mb),
                        "stderr_first_line": first_line(o.stderr),
                        "class": cls,
                        "why": why,
                    }
                )
                mark = "" if cls == "clean" else f"  <-- {cls}: {why} | {first_line(o.stderr)}"
                print(f"[{i:3d}/{len(probes)}] {p.group:24s} {p.name[:48]:48s} rc={o.rc} {o.seconds:5.1f}s{mark}",
                      flush=True)  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    text = table(results)
    bad = [r for r in results if r["class"] != "clean"]
    listing = "\n".join(f"- {r['group']} / {r['name']}: {r['class']} ({r['why']}): `{r['stderr_first_line']}`"
                        for r in bad)  # fmt: skip
    print(f"\n{text}\n\nnot clean: {len(bad)}\n{listing}\n\n{time.monotonic() - started:.0f} s in all")
    (out / "probes.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "table.md").write_text(text + "\n\n" + listing + "\n")
    print(f"results -> {out / 'probes.json'}, {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

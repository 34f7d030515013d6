"""`simplan <subcommand> [args]`: dispatch to one thin script per subcommand.

Each subcommand is a module in scripts/ with `main(argv: list[str] | None) -> int`; they are
imported lazily so `simplan validate` does not pay for importing torch.

Before a subcommand is imported (and with it torch, whose OpenMP runtime reads its settings once, when it
loads) OpenMP's wait policy is chosen unless the environment already has one (OMP_WAIT_POLICY or
GOMP_SPINCOUNT). A command that runs a model for long (train, eval, run, pipeline, ...) looks at the cores
for 0.3 s: when they are free, waiting OpenMP threads spin briefly before they sleep (GOMP_SPINCOUNT=10000:
the planner's many small forward passes run ~1.4x faster than with sleeping threads); when another job
keeps them busy, and for every other command, `OMP_WAIT_POLICY=PASSIVE`: waiting threads sleep at once, so
a competing process slows training and evaluation in proportion instead of collapsing them (2 torch threads
on 2 cores next to one busy job: ~8 s -> ~50 s per training step with long-spinning threads).
bench/bench_under_load.py and bench/RESULTS.md "Thread settings" measure both. `simplan serve` is left
alone: vLLM pins its threads to the cores it owns, where spinning is what it wants. Export
OMP_WAIT_POLICY=PASSIVE or ACTIVE to choose yourself.

Errors are caught once, here: a `UsageError` (core/errors.py: a flag, a path or an input that cannot work)
exits 2 with its message; Ctrl-C exits 130; any other exception exits 1 with one line and the path of a file
that holds the full traceback. `simplan --debug COMMAND ...` (or SIMPLAN_DEBUG=1) prints the traceback instead.
Scripts do not catch errors themselves: `@command` puts a script's `main` behind this same boundary when it is
called directly. Library code raises typed errors for what the user must fix (core/errors.py: MissingInputError,
InputError, MissingPackageError, ...); `usage_errors(ImportError)` marks a plain exception as one where a block can
only fail that way (an env whose package is missing).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path

from simplan.core.errors import UsageError
from simplan.core.io import describe_os_error

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("simplan.scripts.envs_cmd", "list environments, or check an adapter (envs list | envs check NAME)"),
    "collect": ("simplan.scripts.collect", "collect expert / noisy-expert / random trajectories"),
    "counterfactuals": (
        "simplan.scripts.counterfactuals",
        "play other actions from every state of recorded trajectories (simulator data)",
    ),
    "import": ("simplan.scripts.import_cmd", "convert OpenAI or ShareGPT chat transcripts into trajectory JSONL"),
    "validate": ("simplan.scripts.validate", "check trajectory JSONL files against the schema"),
    "build": ("simplan.scripts.build", "build the decider or simulator dataset from trajectories"),
    "models": ("simplan.scripts.models", "list or fetch base models (models list | models fetch NAME)"),
    "train": ("simplan.scripts.train", "LoRA-train the decider or the simulator from a YAML recipe"),
    "eval-model": ("simplan.scripts.eval_model", "offline metrics of a model/adapter on a dataset fold"),
    "fit-judge": (
        "simplan.scripts.fit_judge",
        "fit the outcome judge on dev states; measure the simulator's outcome predictions",
    ),
    "fit-grader": (
        "simplan.scripts.fit_grader",
        "fit the request grader on expert trajectories; measure its accuracy on dev",
    ),
    "serve": ("simplan.scripts.serve", "serve base + adapters with vLLM's OpenAI-compatible server"),
    "run": ("simplan.scripts.run", "run one episode with the planning loop and a live view"),
    "eval": ("simplan.scripts.eval", "evaluate agent arms on a suite of tasks"),
    "traces": ("simplan.scripts.traces", "turn an evaluation's traces into trajectories (the data flywheel)"),
    "report": ("simplan.scripts.report", "write Markdown + HTML reports comparing runs"),
    "pipeline": ("simplan.scripts.pipeline", "the whole job: collect, build, train, eval, report"),
    "flywheel": ("simplan.scripts.flywheel", "one data-flywheel round: harvest, traces, rebuild, continue, eval"),
}


# OpenMP's wait policy for torch (libgomp), chosen before torch loads; a value the user exported wins.
SPIN_SHORT = {"GOMP_SPINCOUNT": "10000"}  # waiting threads spin briefly, then sleep
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}  # waiting threads sleep at once
OPENMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
OPENMP_UNTOUCHED = ("serve",)  # subcommands that keep the runtime's own defaults (see the module docstring)
MODEL_COMMANDS = ("train", "eval", "eval-model", "fit-judge", "run", "pipeline", "flywheel")  # run a model for long
IDLE_SHARE = 0.85  # of the cores idle when the command starts: spin briefly, else sleep


def openmp_settings(command: str, idle: float | None, cores: int) -> dict[str, str]:
    """The OpenMP settings for `command` given the cores left `idle` (core/cpu.py) out of `cores`: spin briefly
    where a model command finds the cores free, sleep at once otherwise (bench/RESULTS.md "Thread settings")."""
    if command in OPENMP_UNTOUCHED:
        return {}
    if command in MODEL_COMMANDS and idle is not None and idle >= IDLE_SHARE * cores:
        return dict(SPIN_SHORT)
    return dict(PASSIVE)


def set_openmp_defaults(command: str, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set `openmp_settings` in `environ` unless the user set a wait policy; must run before torch is imported.
    Returns what it set."""
    if command in OPENMP_UNTOUCHED or any(k in environ for k in OPENMP_KEYS):
        return {}
    idle = None
    if command in MODEL_COMMANDS:
        from simplan.core.cpu import idle_cores

        idle = idle_cores()
    chosen = openmp_settings(command, idle, len(os.sched_getaffinity(0)))
    environ.update(chosen)
    return chosen


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: simplan [--debug] <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "",
        "Run `simplan <command> --help` for a command's options; --debug (or SIMPLAN_DEBUG=1) prints tracebacks.",
    ]
    return "\n".join(lines)


def debug_requested() -> bool:
    return os.environ.get("SIMPLAN_DEBUG", "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested()
    if argv[:1] == ["--debug"]:
        debug, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"simplan: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    set_openmp_defaults(name)

    def run() -> int | None:
        main = importlib.import_module(COMMANDS[name][0]).main
        return inspect.unwrap(main)(rest)  # a script's own `@command` boundary gives way to this one

    return run_command(f"simplan {name}", run, debug=debug)


def run_command(prog: str, body: Callable[[], int | None], *, debug: bool | None = None) -> int:
    """The one error boundary: run `body` and turn what it raises into a message and an exit status. A
    `UsageError` exits 2 with its message; Ctrl-C exits 130; any other exception exits 1 with one line and the
    path of a file that holds the traceback. `debug` (default: SIMPLAN_DEBUG set) prints tracebacks instead."""
    debug = debug_requested() if debug is None else debug
    try:
        return int(body() or 0)
    except UsageError as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the one place an unexpected error is caught: one line, the traceback kept
        name = prog.removeprefix("simplan ").split()[0]
        if debug:
            traceback.print_exc()
            print(f"{prog}: failed: {one_line(e)}", file=sys.stderr)
            return 1
        saved = save_traceback(name)
        where = f"the traceback is in {saved}" if saved else "the traceback could not be saved"
        print(
            f"{prog}: failed: {one_line(e)}\n{prog}: {where}; `simplan --debug {name} ...` prints it", file=sys.stderr
        )
        return 1


MainFunction = Callable[[list[str] | None], int | None]


def command(prog: str) -> Callable[[MainFunction], Callable[[list[str] | None], int]]:
    """Decorator for a script's `main(argv) -> int`: called directly (`python -m simplan.scripts.build`, a test)
    it runs behind `run_command`, as `simplan build` runs it, so it exits 2 on a usage error instead of raising.

        @command("simplan build")
        def main(argv: list[str] | None = None) -> int: ...
    """

    def wrap(main: MainFunction) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def guarded(argv: list[str] | None = None) -> int:
            return run_command(prog, lambda: main(argv))

        return guarded

    return wrap


@contextlib.contextmanager
def usage_errors(*types: type[Exception]) -> Iterator[None]:
    """Within the block, an exception of `types` is the user's to fix (a library call that raises a plain
    FileNotFoundError for a missing input, say): raised again as a `UsageError` with the same message, so the
    boundary exits 2 with that message."""
    try:
        yield
    except UsageError:
        raise
    except types as e:
        raise UsageError(str(e)) from e


def one_line(e: BaseException) -> str:
    """`e` as "Type: first line of its message", at most 300 characters; an OSError in words, with its path
    ("OSError: runs/x/traces.jsonl: no space left on the device")."""
    if isinstance(e, OSError) and e.errno is not None:
        where = f"{e.filename}: " if e.filename else ""
        return f"{type(e).__name__}: {where}{describe_os_error(e)}"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def save_traceback(command: str) -> Path | None:
    """Write the exception being handled to a file in the system's temporary folder; its path, None if unwritable."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        fd, path = tempfile.mkstemp(prefix=f"simplan-{command}-{stamp}-", suffix=".traceback.txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"simplan {command}: {time.strftime('%Y-%m-%d %H:%M:%S')}, pid {os.getpid()}\n")
            traceback.print_exc(file=f)
    except OSError:
        return None
    return Path(path)


if __name__ == "__main__":
    sys.exit(main())

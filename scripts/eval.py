"""`simplan eval`: run agent arms on a suite of tasks, concurrently against one engine; resumable.

    simplan eval --suite twx-dev --arms reactive,plan,simplan --episodes 3 --engine hf \\
        --model smollm2-135m-instruct \\
        --adapters decider=runs/train/decider/adapter,simulator=runs/train/simulator/adapter \\
        --out runs/eval/twx-dev --concurrency 8
    simplan eval --suite twx-dev-faults --faults '{transient: 0.2}' --planner '{horizon: 2}' ...
    simplan eval --suite toy-dev --arms reactive --engine expert --out runs/eval/toy-expert    # no model

`--engine expert` replays each env's expert plan and `--engine random` takes seeded random valid
actions (inference/engines/model_free.py): model-free sanity runs of a suite, reactive arm only. Each
arm asks the engine only for the adapters it uses (reactive: the decider); a run that cannot start
(a missing adapter, an unknown env) writes nothing but the folder's lock file, so the corrected
command needs no --fresh.

`--episodes N` is tasks per game/family (0: the suite's); `--concurrency C` is how many episodes run
at once (their model calls are merged into batched engine calls; with --engine openai it is also
the requests in flight). Re-running the same command resumes; an episode is never counted twice.
Suites: recipes/suites/*.yaml. How it works: `simplan.evaluation.runner`. Then: `simplan report
OUT`. Exit status: 0 when every episode run finished, 1 when some errored (crashed in the planner, env
or engine: the message names the count per arm, the first error and where the tracebacks are; re-running
the same command runs them again), 2 on a bad configuration or an --out that another `simplan eval` is
writing (one run per folder at a time: OUT/eval.lock).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.evaluation.folder_lock import check_unlocked
from simplan.evaluation.report_data import load_run_data
from simplan.evaluation.report_tables import arms_table
from simplan.evaluation.runner import (
    EvalConfig,
    budget_message,
    check_planner_settings,
    errored_message,
    evaluate,
)
from simplan.inference.engines import EngineConfig, engine_from_config, engine_lanes, is_merged
from simplan.inference.engines.config import MODEL_FREE_KINDS
from simplan.scripts.cli import command, usage_errors


@command("simplan eval")
def main(argv: list[str] | None = None) -> int:
    eval_cfg, engine_cfg = parse_config(
        [EvalConfig, EngineConfig], argv, description=__doc__.split("\n")[0], prog="simplan eval"
    )
    engine_info = {"engine": engine_cfg.engine, "model": engine_cfg.model, "adapters": engine_cfg.adapters}
    if engine_cfg.engine in MODEL_FREE_KINDS:  # no model: --model and --adapters change nothing, so record none
        engine_info.update(model="", adapters="")
    check_output_folder(eval_cfg.out)  # before minutes of engine loading, as the lock below
    check_unlocked(Path(eval_cfg.out))  # before minutes of engine loading; evaluate() holds the lock
    check_planner_settings(eval_cfg)  # so is a wrong planner or arm override
    print(f"eval: loading engine {engine_cfg.engine} {engine_cfg.model} {engine_cfg.adapters}", flush=True)
    engine = engine_from_config(engine_cfg, concurrent=True)
    engine_info.update(merge_adapters=is_merged(engine), lanes=engine_lanes(engine))  # what `auto` chose, per run
    try:
        with usage_errors(ImportError):  # an env whose package is not installed (inputs raise UsageErrors)
            outcome = evaluate(eval_cfg, engine, engine_info=engine_info)
    except KeyboardInterrupt:  # Ctrl-C (or a timeout's SIGINT): say what was kept instead of a traceback
        print(
            f"\nsimplan eval: interrupted; the finished episodes are kept in {eval_cfg.out}, and the same command "
            "resumes (episodes cut short, and those whose env the interrupt reached, run again)",
            file=sys.stderr,
        )
        return 130
    finally:
        engine.close()
    print(
        f"eval: {outcome.ran} episode(s) run in {outcome.seconds:.1f}s ({outcome.skipped} already done, "
        f"{outcome.errored} errored) of {outcome.planned}; batching {outcome.batch or 'off'}"
    )
    cut = budget_message(outcome, eval_cfg.max_minutes)
    if cut:
        print(cut)
    run = load_run_data(outcome.out)
    if run.records:
        print(arms_table([run]).markdown())
    print(
        f"traces: {outcome.traces}\nresults: {outcome.results}\nnext: simplan report {outcome.out} --out "
        f"{os.path.join(outcome.out, 'report')}"
    )
    crashed = errored_message(outcome)
    if crashed:  # last, so it is what the user reads: a crashed run must not pass for a finished one
        print(f"simplan eval: {crashed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

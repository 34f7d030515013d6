"""A build's inputs: trajectory files found, every line checked as `simplan validate` checks it, folds kept apart.

    from simplan.data.build_inputs import check_folds, expand_inputs, load_trajectories
    files = expand_inputs(["runs/data/twx-train.jsonl", "runs/data/more/"])   # files, folders, globs
    loaded = load_trajectories(files)           # .trajectories, .problems ("FILE:LINE: ..."), .skipped
    check_folds(loaded.trajectories)            # FoldLeakError when a task id is in two folds

`simplan build` (data/build.py) stops on bad lines with `refuse_malformed` (a `MalformedInputError` naming
each FILE:LINE) unless `keep_going`; offline evaluation reads its trajectories the same way.
"""

from __future__ import annotations

import glob
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from simplan.core.errors import EmptyInputError, InputError, MissingInputError, UsageError
from simplan.core.io import has_lines
from simplan.data.trajectory import Trajectory
from simplan.data.validate import read_trajectory_lines
from simplan.envs.limits import cap_text

MAX_REPORTED_PROBLEMS = 50
# Characters of text a token stands for at most, in the budget that caps observations at read time: English
# averages ~4 per token, so text past budget x 8 characters could never fit the prompt (or the completion) and
# would only cost memory (a 50 MB observation took 3 GB to tokenize before it was dropped).
MAX_CHARS_PER_TOKEN = 8


class FoldLeakError(UsageError, ValueError):
    """A task appears in more than one fold: evaluation on it would be contaminated."""


class MalformedInputError(UsageError, ValueError):
    """Input lines that are not valid trajectories (without `keep_going`); the message names each FILE:LINE."""


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files as given, every *.jsonl in a folder, and glob matches; error naming what matched nothing."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
        elif path.exists():
            found = [path]
        else:
            found = sorted(Path(p) for p in glob.glob(str(path)))
        if not found:
            raise MissingInputError(f"input {item!r}: no such file, or a folder/glob with no .jsonl files")
        files += [f for f in found if f not in files]
    empty = [str(f) for f in files if not has_lines(f)]
    if empty:
        raise EmptyInputError(f"input {', '.join(empty)}: empty (no line to read); give trajectory JSONL files")
    return files


@dataclass
class Loaded:
    trajectories: list[Trajectory] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "FILE:LINE: field: problem"
    malformed_lines: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> trajectories skipped
    capped_steps: int = 0  # steps (or initial observations) with a text cut to `max_chars`
    max_chars: int = 0  # the cap (0: none)


def load_trajectories(files: list[Path], include_errored: bool = False, max_chars: int = 0) -> Loaded:
    """Read and check every line as `simplan validate` does; a bad line is reported as FILE:LINE and skipped.

    Bad lines: those validate rejects, and a trajectory id seen earlier with different content (the
    first one is kept). The same record twice is only counted (`skipped.duplicate_trajectory_id`).
    Observations and action texts longer than `max_chars` (0: no cap) are cut as they are read, with the
    note an env's own cap leaves (envs/limits.py), so one huge line does not hold its text through the build.
    The trajectories come back in the order of their ids: collection workers write records in the order they
    finish, and what is built from the same records must not depend on it (a turn is trained in the first window
    that holds it, data/build_rows.py `conversation_rows`).
    """
    loaded = Loaded(max_chars=max_chars)
    for line in read_trajectory_lines(files):
        problems = list(line.problems)
        if line.duplicate_of is not None and not line.same_content:
            problems.append(line.duplicate_problem())
        if problems:
            loaded.malformed_lines += 1
            loaded.problems += [f"{line.where}: {p}" for p in problems]
            continue
        traj = line.trajectory
        if line.duplicate_of is not None:
            loaded.skipped["duplicate_trajectory_id"] += 1
        elif traj.status == "errored" and not include_errored:
            loaded.skipped["errored_trajectory"] += 1
        else:
            loaded.capped_steps += cap_trajectory(traj, max_chars)
            loaded.trajectories.append(traj)
    loaded.trajectories.sort(key=lambda t: t.id)
    return loaded


def cap_trajectory(traj: Trajectory, max_chars: int) -> int:
    """Cut every goal, observation and action text of `traj` to `max_chars` in place; how many steps (the start
    counted as one) were cut. An imported transcript's opening request is its goal, and a goal is in every prompt."""
    if not max_chars:
        return 0
    capped = 0
    if max(len(traj.initial_observation), len(traj.goal)) > max_chars:
        traj.initial_observation = cap_text(traj.initial_observation, max_chars)
        traj.goal = cap_text(traj.goal, max_chars)
        capped += 1
    for step in traj.steps:
        goal = step.info.get("goal")
        texts = [step.observation, step.next_observation, step.action.text or ""]
        texts += [a.next_observation for a in step.alternatives]
        texts += [goal] if isinstance(goal, str) else []
        if max(map(len, texts)) <= max_chars:
            continue
        capped += 1
        if isinstance(goal, str):
            step.info["goal"] = cap_text(goal, max_chars)
        step.observation = cap_text(step.observation, max_chars)
        step.next_observation = cap_text(step.next_observation, max_chars)
        if step.action.text:
            step.action = replace(step.action, text=cap_text(step.action.text, max_chars))
        for alt in step.alternatives:
            alt.next_observation = cap_text(alt.next_observation, max_chars)
    return capped


def refuse_malformed(loaded: Loaded, files: list[Path]) -> None:
    """Raise MalformedInputError naming the bad lines (the first MAX_REPORTED_PROBLEMS problems)."""
    shown = loaded.problems[:MAX_REPORTED_PROBLEMS]
    more = len(loaded.problems) - len(shown)
    raise MalformedInputError(
        f"{loaded.malformed_lines} bad input line(s):\n"
        + "\n".join(shown)
        + (f"\n... and {more} more problems" if more else "")
        + f"\nFix them (`simplan validate {' '.join(str(f) for f in files)} --keep-going` lists all and splits "
        "good lines from bad), or pass --keep_going true to build from the good lines."
    )


def check_folds(trajectories: list[Trajectory]) -> None:
    """Raise FoldLeakError naming every (env, task id) that appears in two folds."""
    folds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for t in trajectories:
        folds[(t.task.env, t.task.task_id)].add(t.task.fold)
    leaks = {k: sorted(v) for k, v in folds.items() if len(v) > 1}
    if leaks:
        shown = "; ".join(f"{env}/{tid} in {'+'.join(f)}" for (env, tid), f in sorted(leaks.items())[:20])
        more = f" (and {len(leaks) - 20} more)" if len(leaks) > 20 else ""
        raise FoldLeakError(
            f"{len(leaks)} task id(s) appear in more than one fold: {shown}{more}. "
            "Collect each fold from its own task list, or drop the inputs that mix folds."
        )


def check_facts(trajectories: list[Trajectory], files: list[Path]) -> None:
    """A snapshot needs facts to show: refuse trajectories of which none records any (`Step.facts`)."""
    if not any(step.facts for traj in trajectories for step in traj.steps):
        envs = sorted({traj.env for traj in trajectories})
        raise InputError(
            f"--snapshot true: no step of the {len(trajectories)} trajectories in {', '.join(map(str, files))} "
            f"records facts (envs: {', '.join(envs)}). Collect them again with this version (`simplan collect`; "
            "each step then keeps what its observation told, by the env's `facts` extractor), declare `facts` on "
            "the env (docs/writing-an-environment.md), or build without --snapshot"
        )

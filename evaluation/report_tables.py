"""The report's tables: one Table model rendered as Markdown and as HTML, and one function per table.

    from simplan.evaluation.report_tables import arms_table, pct
    print(arms_table([load_run_data("runs/eval/twx-dev")]).markdown())

Each function takes the runs (evaluation/report_data.py RunData) and returns a Table (title, header, rows,
a note saying what the columns mean), or None where no run has what the table shows; a cell is '-'
where the number is unknown. evaluation/report.py lays them out in report.md and report.html.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simplan.envs.base import GRADES
from simplan.evaluation.losses import LOSS_CLASSES, LOSS_LABELS
from simplan.evaluation.metrics import EpisodeRecord, GroupMetrics, group_metrics
from simplan.evaluation.paired import PairedComparison, compare_all, compare_runs
from simplan.evaluation.report_data import RunData
from simplan.inference.planning.arms import ARM_PRESETS, PIVOTS_ABLATION


# ---------------------------------------------------------------------------------------------
# Number formatting and tables (one table model, rendered as Markdown and as HTML)
# ---------------------------------------------------------------------------------------------
def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""

    def markdown(self) -> str:
        out = [f"### {self.title}", ""]
        if self.note:
            out += [self.note, ""]
        out.append("| " + " | ".join(self.header) + " |")
        out.append("|" + "|".join("---" for _ in self.header) + "|")
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return "\n".join(out) + "\n"

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        note = f"<p class='note'>{html.escape(self.note)}</p>" if self.note else ""
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return f"<h3>{html.escape(self.title)}</h3>{note}{table}"


ARM_HEADER = [
    "run",
    "arm",
    "episodes",
    "success [95% CI]",
    "score",
    "steps",
    "invalid/ep",
    "redundant/ep",
    "pivots/ep",
    "replans/ep",
    "recovery (faulted eps)",
    "calls/ep",
    "tokens/ep",
    "tokens/success",
    "wall s/ep",
    "wall s/success",
    "planning share",
    "sim accuracy",
]


def arm_row(run: str, m: GroupMetrics) -> list[str]:
    recovery = "-" if m.recovery_rate is None else f"{pct(m.recovery_rate)} ({m.recovered}/{m.faulted_episodes})"
    sim = "-" if m.sim_accuracy is None else f"{pct(m.sim_accuracy)} ({m.sim_exact}/{m.sim_predictions})"
    errored = f", {m.errored} errored" if m.errored else ""
    return [
        run,
        m.arm,
        f"{m.episodes}{errored}",
        f"{pct(m.success_rate)} [{pct(m.ci_low)}, {pct(m.ci_high)}] ({m.successes}/{m.episodes})",
        num(m.mean_score),
        num(m.mean_steps, 1),
        num(m.invalid_per_episode),
        num(m.redundant_per_episode),
        num(m.pivots_per_episode),
        num(m.replans_per_episode),
        recovery,
        num(m.calls_per_episode, 1),
        num(m.tokens_per_episode, 0),
        num(m.tokens_per_success, 0),
        num(m.wall_per_episode),
        num(m.wall_per_success),
        pct(m.planning_share),
        sim,
    ]


def arms_table(runs: list[RunData]) -> Table:
    rows = [arm_row(r.name, m) for r in runs for m in r.arms]
    return Table(
        "Arms side by side",
        ARM_HEADER,
        rows,
        "Per episode means; invalid = real actions the env flagged as failed (injected faults included); "
        "tokens = prompt + completion (scored candidates count as prompt tokens); planning share = "
        "planning seconds / wall seconds; sim accuracy = exact predictions / predicted real steps.",
    )


def tokens_pair(prompt: float | None, prefilled: float | None) -> str:
    return "-" if prompt is None or prefilled is None else f"{num(prompt, 1)} / {num(prefilled, 1)}"


def prompt_steps_table(runs: list[RunData]) -> Table:
    rows = []
    for r in runs:
        for m in r.arms:
            unsplit = f" ({m.unsplit_decisions} imagined)" if m.unsplit_decisions else ""
            rows.append(
                [
                    r.name,
                    m.arm,
                    str(m.real_steps),
                    f"{m.decisions}{unsplit}",
                    str(m.imagined_steps),
                    f"{m.simulated_decisions} / {m.reactive_decisions}",
                    tokens_pair(m.prompt_per_decision, m.prefilled_per_decision),
                    tokens_pair(m.prompt_per_imagined_step, m.prefilled_per_imagined_step),
                    tokens_pair(m.prompt_per_real_step, m.prefilled_per_real_step),
                    num(m.context_prefilled_per_decision, 1),
                    num(m.context_prefilled_per_imagined_step, 1),
                    num(m.context_prefilled_per_real_step, 1),
                    num(m.candidate_tokens_per_decision, 1),
                    pct(m.prompt_cache_share),
                ]
            )
    return Table(
        "Prompt tokens per step",
        [
            "run",
            "arm",
            "real steps",
            "decisions",
            "imagined steps",
            "decisions simulated / reactive",
            "per decision: prompt / prefilled",
            "per imagined step: prompt / prefilled",
            "per real step, all calls: prompt / prefilled",
            "context prefilled per decision",
            "context prefilled per imagined step",
            "context prefilled per real step",
            "scored candidate tokens per decision",
            "cache hit share",
        ],
        rows,
        "Totals over the arm's episodes; prefilled = prompt - tokens the engine reused from its prefix cache; "
        "scored candidates count as prompt tokens. A decision is a decider call from the real state (followed by "
        "a real action); an imagined step is one prediction in a rollout, its simulator call and the decider call "
        "after it. A decision is reactive when nothing was imagined for it (the reactive arm, a confident decider, "
        "or the selective router's choice). Where a trace does not split a decision's tokens from its rollouts', "
        "the per-decision and per-imagined-step columns show '-' (the count of such decisions in brackets). "
        "Context prefilled = prefilled - scored candidate tokens: the prompt's context (goal, history, new "
        "observation) the engine computed anew. Scored candidate tokens = each valid action the decider scored, "
        "+ EOS, in full (the hf engine computes a prefix shared by candidates once, so this overstates its work); "
        "they are the same in every prompt format. Where a trace does not count them, their columns show '-'.",
    )


def signed_pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def signed_num(x: float) -> str:
    return f"{x:+.2f}"


def paired_row(run: str, c: PairedComparison, compared: str | None = None) -> list[str]:
    """One row of a paired table; `compared` names B and A (default: the arms, 'simplan - reactive')."""

    def per_success(a: float | None, b: float | None, digits: int) -> str:
        return f"{num(a, digits)} -> {num(b, digits)}"

    return [
        run,
        compared or f"{c.arm_b} - {c.arm_a}",
        str(c.pairs) + (f" ({c.unpaired} unpaired left out)" if c.unpaired else ""),
        f"{c.a_successes} -> {c.b_successes}",
        f"{c.a_only} / {c.b_only}",
        f"{signed_pct(c.difference)} [{signed_pct(c.ci_low)}, {signed_pct(c.ci_high)}]",
        f"{c.p_value:.3g}",
        f"{num(c.a_score)} -> {num(c.b_score)}",
        f"{signed_num(c.score_difference)} [{signed_num(c.score_ci_low)}, {signed_num(c.score_ci_high)}]",
        f"{c.a_higher} / {c.b_higher}",
        f"{c.score_p_value:.3g}",
        per_success(c.a_cost.tokens_per_success, c.b_cost.tokens_per_success, 0),
        per_success(c.a_cost.wall_per_success, c.b_cost.wall_per_success, 2),
    ]


PAIRED_COLUMNS = [  # after the two naming what is compared (paired_row)
    "pairs",
    "successes A -> B",
    "won by A only / B only",
    "success diff, points [95% paired bootstrap]",
    "McNemar p (exact)",
    "mean score A -> B",
    "score diff [95% paired bootstrap]",
    "higher score A / B",
    "sign test p (exact)",
    "tokens/success A -> B",
    "wall s/success A -> B",
]


def arm_comparisons(runs: list[RunData]) -> list[tuple[str, PairedComparison]]:
    """Every pair of arms of each run, compared task by task (evaluation/paired.py `compare_all`), with the run's
    name: computed once per report, for its headline and its paired table."""
    return [(r.name, c) for r in runs for c in compare_all(r.records)]


def headline(comparisons: list[tuple[str, PairedComparison]], runs: list[RunData]) -> list[str]:
    """What the report leads with: each arm of each run against the run's first arm (reactive when played; the
    first of `compare_all`'s pairs names it), as a sentence with the paired difference, its interval, the
    discordant tasks and the McNemar p-value; then the mean final scores, their paired difference and sign test.
    Where the run also played `reactive-pivots` (the pivots without imagination), each arm whose episodes pivoted
    and imagined (`adds_imagination`) against it follows: what imagination adds to the pivots."""
    records = {r.name: r.records for r in runs}
    first: dict[str, str] = {}
    lines, ablations = [], []
    for run, c in comparisons:
        if first.setdefault(run, c.arm_a) == c.arm_a:
            lines.append(_comparison_sentence(run, c))
        elif c.arm_a == PIVOTS_ABLATION and adds_imagination(records.get(run, []), c.arm_a, c.arm_b):
            ablations.append(_comparison_sentence(run, c, "what imagination adds to the pivots, "))
    return lines + ablations


def adds_imagination(records: list[EpisodeRecord], ablation: str, arm: str) -> bool:
    """Whether `arm` is the `ablation` arm plus imagination as the episodes ran (their start events' settings, the
    arm's preset where a trace lacks them): every episode of the ablation with pivots on and horizon 0, every
    episode of `arm` with pivots on and a horizon above 0. An override that turned either arm's pivots off, or
    imagination on in the ablation, makes their difference something else."""

    def played(name: str) -> set[tuple[bool, int]]:
        preset = ARM_PRESETS.get(name, {})
        return {
            (
                bool(preset.get("pivots") if r.pivots_on is None else r.pivots_on),
                int(preset.get("horizon", 0) if r.horizon is None else r.horizon),
            )
            for r in records
            if r.summary.arm == name
        }

    base, imagined = played(ablation), played(arm)
    return bool(base and imagined) and all(p and h == 0 for p, h in base) and all(p and h > 0 for p, h in imagined)


def _comparison_sentence(run: str, c: PairedComparison, gloss: str = "") -> str:
    return (
        f"{run}: {gloss}**{c.arm_b} - {c.arm_a} = {signed_pct(c.difference)} points** "
        f"[{signed_pct(c.ci_low)}, {signed_pct(c.ci_high)}] (95% paired bootstrap) on {c.pairs} paired "
        f"tasks: {c.b_successes}/{c.pairs} against {c.a_successes}/{c.pairs}; won by {c.arm_b} only "
        f"{c.b_only}, by {c.arm_a} only {c.a_only}; exact McNemar p = {c.p_value:.3g}. Mean final score "
        f"{num(c.a_score)} -> {num(c.b_score)} ({signed_num(c.score_difference)} [{signed_num(c.score_ci_low)}, "
        f"{signed_num(c.score_ci_high)}]): higher for {c.arm_b} on {c.b_higher} tasks, for {c.arm_a} on "
        f"{c.a_higher}; exact sign test p = {c.score_p_value:.3g}."
    )


def coverage_lines(runs: list[RunData]) -> list[str]:
    """A headline line for each run that finished fewer episodes than its last invocation planned (a time
    budget or --limit cut it): how many, and that the comparisons count only the tasks both arms finished."""
    lines = []
    for r in runs:
        config = r.info.get("eval_config.json", {})
        tasks, arms = config.get("step_caps") or {}, (config.get("eval") or {}).get("arms") or []
        planned = len(tasks) * len(arms)
        finished = sum(1 for rec in r.records if rec.summary.arm in arms)
        if not planned or finished >= planned:
            continue
        last = (r.info.get("run.json", {}).get("invocations") or [{}])[-1]
        cut = "unstarted" if not last.get("stopped") else f"unstarted or stopped ({last['stopped']} stopped running)"
        why = (
            f"the time budget ({last['max_minutes']:g} min) left the rest {cut}"
            if (last.get("not_started") or last.get("stopped")) and last.get("max_minutes")
            else "the rest were not run"
        )
        lines.append(
            f"{r.name}: {finished} of {planned} planned episodes finished ({why}); the paired comparisons count the "
            "tasks both arms finished."
        )
    return lines


def paired_table(comparisons: list[tuple[str, PairedComparison]]) -> Table:
    rows = [paired_row(run, c) for run, c in comparisons]
    return Table(
        "Paired differences between arms (same tasks)",
        ["run", "arms (B - A)", *PAIRED_COLUMNS],
        rows or [["-"] * (2 + len(PAIRED_COLUMNS))],
        "Each pair is one task (and repeat) run by both arms; only such episodes count here. The difference is "
        "B's success rate minus A's in percentage points, its interval a percentile bootstrap of 10,000 seeded "
        "resamples of the pairs; the McNemar p-value is the two-sided exact binomial test on the tasks only one "
        "arm won. The score is each episode's final score (partial progress short of a win: TWX's share of the "
        "task done, -1 after a failed answer), its difference and interval computed the same way; the sign test is "
        "the same exact binomial test on the tasks where one arm ended with the higher score. Tokens and wall "
        "seconds per success are over the paired episodes.",
    )


def runs_table(runs: list[RunData]) -> Table | None:
    """Each later run against the first, arm by arm, on the tasks both ran (None with one run)."""
    first = runs[0]
    rows = [
        paired_row(f"{first.name} -> {later.name}", c, compared=c.arm_a)
        for later in runs[1:]
        for c in compare_runs(first.records, later.records)
    ]
    if not rows:
        return None
    return Table(
        "Paired differences between runs (same arm, same tasks)",
        ["runs (A -> B)", "arm", *PAIRED_COLUMNS],
        rows,
        "Each pair is one task (env, task id, repeat; the suite's name aside) that both runs played with this arm, "
        "the first run against each later one (a flywheel round's old and new adapters, say); tasks only one run "
        "played are left out. Statistics as between arms. Wall seconds compare only runs on the same machine "
        "under the same load.",
    )


def loss_table(runs: list[RunData]) -> Table:
    rows = []
    for r in runs:
        for m in r.arms:
            lost = m.episodes - m.successes
            rows.append([r.name, m.arm, f"{lost}/{m.episodes}"] + [str(m.losses.get(c, 0)) for c in LOSS_CLASSES])
    return Table(
        "Lost episodes by cause (from the traces)",
        ["run", "arm", "lost"] + [LOSS_LABELS[c] for c in LOSS_CLASSES],
        rows,
        "Each lost episode counts once, in the first class that applies (evaluation/losses.py): env error "
        "(status errored); irreversible wrong action (the last action ended the game unwon); parse failures "
        "(decider unparseable at least once per two steps); loop / no progress (ended by the step or replan "
        "budget with half the steps repeating or half the pivots repeated_action / no_progress); step cap "
        "(the step budget otherwise); time/token/replan budget; other.",
    )


def retry_table(runs: list[RunData]) -> Table | None:
    """Transient failures and finish calls per arm, for the runs that have any (a TWX run has neither); None
    when no run has."""
    rows = []
    for r in runs:
        if not any(m.transient_failures or m.finish_calls for m in r.arms):
            continue
        for m in r.arms:
            through = "-" if m.got_through_share is None else f"{m.got_through} [{pct(m.got_through_share)}]"
            rows.append(
                [
                    r.name,
                    m.arm,
                    str(m.transient_failures),
                    through,
                    f"{m.injected_transient} / {m.transient_failures - m.injected_transient}",
                    f"{m.premature_finish_episodes}/{m.episodes}",
                    str(m.finish_calls),
                ]
            )
    if not rows:
        return None
    return Table(
        "Transient failures and finishes",
        [
            "run",
            "arm",
            "transient failures",
            "got through [share]",
            "injected / env's own",
            "episodes with a premature finish / episodes",
            "finish calls",
        ],
        rows,
        "A transient failure is a real action that failed as an injected transient fault or with an observation "
        "matching the env's transient patterns; it got through when a later action of the episode with the same "
        "key was not transient (a success or a real answer such as out of stock). A premature finish is a finish "
        "the env took while the goal was not met; finish calls count the finishes the env took (a finish that "
        "failed transiently is a transient failure, not a finish).",
    )


def _arm_rows(
    runs: list[RunData], shown: Callable[[GroupMetrics], bool], cells: Callable[[GroupMetrics], list[Any]]
) -> list[list[str]]:
    """A row per arm (the run's name, the arm, then `cells`) of each run where some arm is `shown`."""
    return [[r.name, m.arm, *map(str, cells(m))] for r in runs if any(shown(m) for m in r.arms) for m in r.arms]


def backtrack_table(runs: list[RunData]) -> Table | None:
    """Steps undone by their inverse per arm (pivot_rules.backtrack), for the runs where one was; None otherwise."""
    rows = _arm_rows(runs, lambda m: m.backtracks > 0, lambda m: [m.backtracks, m.backtracks_restored, m.episodes])
    if not rows:
        return None
    return Table(
        "Backtracking",
        ["run", "arm", "steps undone", "of them restored", "episodes"],
        rows,
        "A step is undone when a pivot that pivot_rules.backtrack names fired after it and the env knows its inverse "
        "(EnvDefaults.inverse); restored: the inverse brought back the valid actions and the score of the state "
        "before the step, where the undone step is then banned.",
    )


def ask_table(runs: list[RunData]) -> Table | None:
    """Questions to the user per arm, for the runs on an env with someone to ask (EnvDefaults.ask_tool); None
    otherwise."""
    rows = _arm_rows(
        runs,
        lambda m: m.ask_episodes > 0,
        lambda m: [m.asks, f"{m.asked_episodes}/{m.ask_episodes}", of_count(m.asked_successes, m.asked_episodes)],
    )
    if not rows:
        return None
    return Table(
        "Questions to the user",
        ["run", "arm", "questions asked", "episodes that asked / episodes", "of them won"],
        rows,
        "A question is a real call to the tool the env declares for asking the user what the request left out "
        "(EnvDefaults.ask_tool), answered from the task's hidden intent; each one is a cost (a step, a model call).",
    )


def grade_table(runs: list[RunData]) -> Table | None:
    """Per arm and request grade (PlannerConfig grading), for the runs that graded their requests; None otherwise."""
    rows = []
    for r in runs:
        graded: dict[tuple[str, str], list] = {}
        for rec in r.records:
            if rec.summary.grade is not None:
                graded.setdefault((rec.summary.arm, rec.summary.grade), []).append(rec)
        for (arm, grade), recs in sorted(graded.items(), key=lambda kv: (kv[0][0], GRADES.index(kv[0][1]))):
            m = group_metrics(arm, grade, recs)
            asks = m.asks if m.ask_episodes else "-"
            rows.append([r.name, arm, grade, str(m.episodes), of_count(m.successes, m.episodes),
                         num(m.tokens_per_success, 0), str(asks)])  # fmt: skip
    if not rows:
        return None
    return Table(
        "Request grades",
        ["run", "arm", "grade", "episodes", "won", "tokens per success", "questions asked"],
        rows,
        "Each request was graded before its episode (trivial, single-step, multi-step, ambiguous: "
        "inference/planning/grading.py, by the env's rule or the fitted grader, each episode's grade event) and took "
        "its grade's route (budgets; whether it may ask the user).",
    )


def subgoal_table(runs: list[RunData]) -> Table | None:
    """The env's sub-goals at work per arm, for the runs that tracked them (PlannerConfig.subgoals with an env that
    declares them); None when no run did."""
    rows = _arm_rows(
        runs,
        lambda m: m.subgoal_episodes > 0,
        lambda m: [m.subgoal_screens, m.subgoal_repairs, f"{m.unmet_episodes}/{m.subgoal_episodes}"],
    )
    if not rows:
        return None
    return Table(
        "Sub-goals",
        ["run", "arm", "decisions screened", "calls repaired", "episodes ending with a sub-goal unmet / tracked"],
        rows,
        "A decision is screened when one of the decider's proposals contradicts the first unmet sub-goal the env "
        "declares (inference/planning/subgoals.py); a call is repaired when it is decoded again with the value an "
        "equality condition names (the other contradicting proposals go after the rest).",
    )


def of_count(part: int | None, whole: int | None) -> str:
    """'part/whole [share]', '-' when unknown."""
    if part is None or whole is None:
        return "-"
    return f"{part}/{whole}" + (f" [{pct(part / whole)}]" if whole else "")


def verdict_table(runs: list[RunData]) -> Table | None:
    """Were the predicted endings right, and did they change decisions: per arm, for the runs where some arm's
    predictions carried verdicts; None when no run's did. The cells are metrics.json's counters."""
    rows = []
    for r in runs:
        if not any(m.verdict_episodes for m in r.arms):
            continue
        for m in r.arms:
            if not m.verdict_episodes:
                rows.append([r.name, m.arm, f"0/{m.episodes}"] + ["-"] * 3)
                continue
            known = m.verdict_episodes_recorded
            recorded = f" ({known} recorded)" if known < m.verdict_episodes else ""
            rows.append(
                [
                    r.name,
                    m.arm,
                    f"{m.verdict_episodes}/{m.episodes}{recorded}",
                    of_count(m.ending_foreseen, m.ending_steps),
                    of_count(m.verdict_false_alarms, m.verdict_steps),
                    of_count(m.lost_candidates_avoided, m.candidates_predicted_lost),
                ]
            )
    if not rows:
        return None
    return Table(
        "Episode endings foreseen",
        [
            "run",
            "arm",
            "episodes with verdicts",
            "ending steps foreseen",
            "false alarms / steps predicted to end",
            "candidates predicted lost: avoided",
        ],
        rows,
        "Only episodes whose predictions carried verdicts (the env oracle, or a simulator trained with "
        "'[episode over: won|lost]'). An ending step is a real step that ended the episode and had a prediction; "
        "foreseen when that prediction carried its verdict (won / lost). A false alarm is a real step predicted to "
        "end that went on or ended with the other verdict. Candidates predicted lost count each decision's "
        "distinct first actions whose first step was predicted lost; avoided when the decision took another. "
        "metrics.json: ending_foreseen/ending_steps, verdict_false_alarms/verdict_steps, "
        "lost_candidates_avoided/candidates_predicted_lost. Episodes whose acts do not record their predicted "
        "verdict count only in the last column (the others count the 'recorded' ones; '-' when none).",
    )


def departure_table(runs: list[RunData]) -> Table | None:
    """Where the judge committed another action than the decider's most likely one, per arm, for the runs where
    some arm did; None when no run's did."""

    def cells(m: GroupMetrics) -> list[str]:
        won = of_count(m.departure_won_episodes, m.successes)
        lost = of_count(m.departure_episodes - m.departure_won_episodes, m.episodes - m.successes)
        parts = ", ".join(f"{part} {n}" for part, n in m.departures_by_part.items()) or "-"
        return [of_count(m.departures, m.judged_choices), won, lost, parts]

    rows = _arm_rows(runs, lambda m: m.departures > 0, cells)
    if not rows:
        return None
    return Table(
        "Where the judge departed from the decider",
        ["run", "arm", "departures / judged choices", "won episodes with one", "lost episodes with one", "parts"],
        rows,
        "A judged choice is a decision whose imagined candidates held at least two first actions with the decider's "
        "likelihood known; a departure commits another first action than the decider's most likely one. Parts: for "
        "each departure, the judge's score part (likelihood aside) that gained most for the committed candidate "
        "over the decider's top one (inference/planning/judge.py). Departures that come only in lost episodes, by "
        "one part, point at that part as one to fit or turn off (metrics.json: departures, judged_choices, "
        "departures_by_part, departure_episodes).",
    )


def lost_episodes_table(runs: list[RunData]) -> Table:
    rows = [
        [r.name, rec.loss.arm, rec.loss.family, rec.loss.episode_id, LOSS_LABELS[rec.loss.label], rec.loss.evidence]
        for r in runs
        for rec in r.records
        if rec.loss is not None
    ]
    return Table("Lost episodes", ["run", "arm", "game", "episode", "cause", "evidence"], rows or [["-"] * 6])


def family_tables(run: RunData) -> list[Table]:
    arms = [m.arm for m in run.arms]
    fams = sorted({m.family for m in run.families})
    cell = {(m.arm, m.family): m for m in run.families}
    success_rows, detail_rows = [], []
    for fam in fams:
        row = [fam]
        for arm in arms:
            m = cell.get((arm, fam))
            row.append("-" if m is None else f"{pct(m.success_rate)} ({m.successes}/{m.episodes})")
            if m is not None:
                detail_rows.append(
                    [
                        fam,
                        arm,
                        str(m.episodes),
                        pct(m.success_rate),
                        num(m.mean_score),
                        num(m.mean_steps, 1),
                        num(m.invalid_per_episode),
                        num(m.pivots_per_episode),
                        num(m.tokens_per_episode, 0),
                        num(m.wall_per_episode),
                    ]
                )
        success_rows.append(row)
    total = ["all"] + [f"{pct(m.success_rate)} ({m.successes}/{m.episodes})" for m in run.arms]
    success_rows.append(total)
    return [
        Table(f"{run.name}: success by game", ["game"] + arms, success_rows),
        Table(
            f"{run.name}: per game and arm",
            [
                "game",
                "arm",
                "episodes",
                "success",
                "score",
                "steps",
                "invalid/ep",
                "pivots/ep",
                "tokens/ep",
                "wall s/ep",
            ],
            detail_rows,
        ),
    ]


def reasons_table(runs: list[RunData]) -> Table:
    rows = []
    for r in runs:
        for m in r.arms:
            for rule, n in m.pivots_by_rule.items():
                rows.append([r.name, m.arm, "pivot fired", rule, str(n)])
            for reason, n in m.replans_by_reason.items():
                rows.append([r.name, m.arm, "replan", reason, str(n)])
    return Table("Pivot and replan reasons", ["run", "arm", "event", "rule", "count"], rows or [["-"] * 5])


def files_table(runs: list[RunData]) -> Table:
    rows = []
    for r in runs:
        suite = r.info.get("eval_config.json", {}).get("suite", {}).get("name", "")
        for f in r.files:
            rows.append(
                [r.name, suite, f["path"], str(f["lines"]), f"{f['bytes']:,}", f["sha256"][:16], str(len(r.records))]
            )
    return Table(
        "Trace files (every number below is computed from these)",
        ["run", "suite", "trace file", "lines", "bytes", "sha256[:16]", "finished episodes"],
        rows,
    )


def _budget_cell(inv: dict[str, Any]) -> str:
    """An invocation's episodes left by its time budget: not started (+ stopped while running) (the budget)."""
    n, stopped = inv.get("not_started") or 0, inv.get("stopped") or 0
    if not n and not stopped:
        return "-"
    return f"{n}{f' + {stopped} stopped' if stopped else ''} ({inv.get('max_minutes', 0):g} min)"


def invocations_table(runs: list[RunData]) -> Table | None:
    rows = []
    for r in runs:
        for inv in r.info.get("run.json", {}).get("invocations", []):
            b = inv.get("batch") or {}
            eng = inv.get("engine") or {}
            rows.append(
                [
                    r.name,
                    inv.get("finished", ""),
                    str(inv.get("episodes_run", "")),
                    _budget_cell(inv),
                    num(inv.get("seconds")),
                    str(inv.get("concurrency", "")),
                    f"{eng.get('engine', '')} {eng.get('model', '')}".strip() or "-",
                    f"{b.get('episode_calls', '-')} -> {b.get('underlying_calls', '-')}" if b else "off",
                ]
            )
    if not rows:
        return None
    return Table(
        "Eval invocations (from run.json, not from traces)",
        [
            "run",
            "finished",
            "episodes",
            "left by the time budget",
            "seconds",
            "concurrency",
            "engine",
            "batching: episode calls -> engine calls",
        ],
        rows,
    )

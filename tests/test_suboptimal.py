"""A plan that is the best of bad ones says so (issue 32 item 4, in part): the commit event's `suboptimal` names why
(every candidate under judge.threshold, or over the outcome judge's veto), the live view shows it and the episode
summary counts it.

    .venv/bin/pytest -q tests/test_suboptimal.py
"""

from __future__ import annotations

from simplan.envs.toy import ToyEnv
from simplan.inference.engines.scripted import ScriptedEngine, toy_expert_action
from simplan.inference.planning.outcomes import OutcomeJudge
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.trace import CandidateRecord, format_event


def _run(simulated: str):
    env = ToyEnv()

    def score(req, text):  # noqa: ANN001, ANN202 - the expert's action in the real state
        best = toy_expert_action(env)
        return [0.0 if c == best else -5.0 for c in req.candidates]

    engine = ScriptedEngine(lambda req, user: toy_expert_action(env), lambda req, user: simulated, score)
    cfg = PlannerConfig.from_dict({"arm": "simplan-always", "budgets": {"max_steps": 3}})
    return Planner(engine, env, cfg).run(env.tasks("dev")[0])


def test_a_plan_every_candidate_of_which_fails_is_flagged_and_counted():
    bad = _run("Error: you cannot do that.")  # every imagined step an error: every total under -1
    commits = bad.trace.of_type("commit")
    assert commits and all(c.suboptimal.startswith("every candidate scored below judge.threshold -1") for c in commits)
    assert bad.summary.suboptimal_commits == len(commits)
    assert "(suboptimal: every candidate scored below judge.threshold -1: the best" in format_event(commits[0])
    fine = _run("You are in a quiet room.")
    assert fine.summary.suboptimal_commits == 0
    assert all(c.suboptimal == "" for c in fine.trace.of_type("commit"))


def test_the_outcome_judge_flags_a_least_bad_choice():
    class Stub:  # what Imagination.suboptimal reads
        outcome_judge = OutcomeJudge(veto=0.5)

    from simplan.inference.planning.imagination import Imagination

    over = CandidateRecord(index=0, actions=["a"], parts={"bad": 0.8})
    assert Imagination.suboptimal(Stub(), over) == "every candidate over the veto 0.50: took the least bad (0.80)"
    assert Imagination.suboptimal(Stub(), CandidateRecord(index=0, actions=["a"], parts={"bad": 0.2})) == ""

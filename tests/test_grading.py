"""Grading requests (issue 32 item 5): a request's grade is what its expert's path needed (data/grades.py), a grader
fitted on expert requests predicts it from the goal and first observation (inference/planning/grading.py,
`simplan fit-grader`), or the env's own rule gives it; the grade's route sets the episode's budgets and whether
it may ask the user, traced by a grade event.

.venv/bin/pytest -q tests/test_grading.py
"""

from __future__ import annotations

import json
import re

import pytest

from simplan.core.errors import InputError
from simplan.data.grades import GRADES, request_words
from simplan.envs.base import Action, Observation, Task, path_grade
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.grading import GradingConfig, RequestGrader, withhold
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.trace import GradeEvent, event_from_dict, format_event, summarize

VAGUE = Task("shop", "shop-110", "dev", "office", {"seed": 110})  # "Order some stapler(s)": the user wants 1
PLAIN = Task("shop", "shop-112", "dev", "kitchen", {"seed": 112})  # "Order 1 lamp(s)"


def test_a_grade_is_what_the_path_needed():
    search, ask, done = Action.tool_call("search", {"query": "x"}), Action.tool_call("ask"), Action(kind="finish")
    assert path_grade([done], "ask") == "trivial"
    assert path_grade([Action(kind="answer", text="42"), done], "ask") == "trivial"
    assert path_grade([search, done], "ask") == "single-step"
    assert path_grade([Action.command("open door"), Action.command("go east")], None) == "multi-step"
    assert path_grade([search, ask], "ask") == "ambiguous"
    assert path_grade([ask, search], None) == "multi-step"  # no one to ask: the call is one more step


def test_request_words_keep_that_a_number_is_there_not_which():
    words = request_words("Order 3 kettle(s).", "User: Order 12 kettle(s).")
    assert "goal:<num>" in words and "goal:order_<num>" in words and "<num>_kettle" in words
    assert not any(re.search(r"\d", w) for w in words)
    assert request_words("Order some kettle(s).", "")[:2] == ["goal:order", "goal:some"]


def _requests() -> tuple[list[list[str]], list[str]]:
    products = ["kettle", "lamp", "tent", "stapler", "mug", "desk"]
    requests, grades = [], []
    for i, p in enumerate(products):
        requests += [f"Order some {p}", f"Order {i + 2} {p}", f"Say hello to the {p}", f"Find the {p}"]
        grades += ["ambiguous", "multi-step", "trivial", "single-step"]
    return [request_words(r, "") for r in requests], grades


def test_the_fitted_grader_recovers_the_grades_of_unseen_requests(tmp_path):
    words, grades = _requests()
    grader = RequestGrader.fit(words, grades)
    for text, want in [("Order some lantern", "ambiguous"), ("Order 7 lantern", "multi-step"),
                       ("Say hello to the lantern", "trivial"), ("Find the lantern", "single-step")]:  # fmt: skip
        grade, probs = grader.grade(request_words(text, ""))
        assert grade == want and probs[want] > 0.5
        assert sum(probs.values()) == pytest.approx(1.0) and set(probs) == set(GRADES)
    assert "goal:some" in grader.top_words()["ambiguous"]
    path = grader.save(tmp_path / "grader.json")
    again = RequestGrader.load(path)
    request = request_words("Order some lantern", "")
    assert again.probabilities(request) == pytest.approx(grader.probabilities(request), abs=1e-12)


def test_a_bad_grader_file_is_named(tmp_path):
    with pytest.raises(InputError, match="does not exist; fit one with `simplan fit-grader`"):
        RequestGrader.load(tmp_path / "missing.json")
    bad = tmp_path / "grader.json"
    bad.write_text(json.dumps({"grades": ["easy"], "counts": {"easy": {}}, "requests": {"easy": 1}}))
    with pytest.raises(InputError, match=r"grader.json has grades \['easy'\]"):
        RequestGrader.load(bad)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"mode": "sometimes"}, "grading.mode: 'sometimes' is not one of off, fitted, env"),
        ({"mode": "fitted"}, "grading.grader: mode fitted needs a grader file"),
        ({"routes": {"hard": {}}}, "grading.routes: 'hard' is not a grade"),
        ({"routes": {"trivial": {"temperature": 1}}}, r"grading.routes\['trivial'\]: unknown keys \['temperature'\]"),
        ({"routes": {"trivial": {"ask": "no"}}}, r"grading.routes\['trivial'\].ask: must be true or false"),
    ],
)
def test_grading_config_names_the_bad_field(section, message):
    with pytest.raises(ValueError, match=message):
        GradingConfig(**section)


def test_withholding_a_tool_hides_it_in_either_tool_format():
    tools = [{"name": "search"}, {"type": "function", "function": {"name": "ask"}}]
    obs = withhold(Observation("hi", tools=tools), ["ask"])
    assert obs.tools == [{"name": "search"}] and withhold(obs, []) is obs


def insistent_decider(req, text):  # noqa: ANN001, ANN201 - ScriptedEngine's responder
    """Asks on its first call whatever the request says (the ask tool shown or not), then orders what it was told
    (or 1)."""
    from test_ask import asking_decider

    insistent_decider.prompts.append("\n".join(m["content"] for m in req.messages))
    return "ask(question='How many?')" if len(insistent_decider.prompts) == 1 else asking_decider(req, text)


def _run(task: Task, grading: dict, **budgets):  # noqa: ANN202
    from simplan_shop.env import ShopEnv

    insistent_decider.prompts = []
    cfg = PlannerConfig.from_dict(
        {"arm": "reactive", "raise_errors": True, "budgets": {"max_steps": 10, **budgets}, "grading": grading}
    )
    return Planner(ScriptedEngine(insistent_decider), ShopEnv(ambiguous=True), cfg).run(task)


def test_the_env_rule_lets_only_an_ambiguous_request_ask(shop_on_path):
    result = _run(VAGUE, {"mode": "env"})
    grade = next(e for e in result.trace.events if isinstance(e, GradeEvent))
    assert (grade.grade, grade.by, grade.withheld) == ("ambiguous", "env", [])
    assert result.summary.success and result.summary.asks == 1 and result.summary.grade == "ambiguous"
    assert "ask" in insistent_decider.prompts[0]

    result = _run(PLAIN, {"mode": "env"})  # the same decider asks anyway: a parse failure, never sent to the env,
    # and the decider is asked again
    grade = next(e for e in result.trace.events if isinstance(e, GradeEvent))
    assert (grade.grade, grade.withheld) == ("multi-step", ["ask"])
    assert '"name": "ask"' not in insistent_decider.prompts[0] and "ask(" not in insistent_decider.prompts[0]
    failures = result.trace.of_type("parse_failure")
    assert failures and "ask is not among this episode's tools" in failures[0].reason
    assert result.summary.asks == 0 and result.summary.success
    assert "[grade] multi-step (by env); may not use ask" in format_event(grade)
    again = event_from_dict(grade.to_dict())
    assert again == grade and summarize(result.trace).grade == "multi-step"

    ungraded = _run(PLAIN, {})  # grading off: no grade event, the tool is offered
    assert not ungraded.trace.of_type("grade") and ungraded.summary.grade is None and ungraded.summary.asks == 1


def test_a_grade_route_sets_the_episodes_budgets(shop_on_path):
    result = _run(PLAIN, {"mode": "env", "routes": {"multi-step": {"max_steps": 2}}})
    start = result.trace.events[0]
    assert start.budgets["max_steps"] == 2 and result.summary.status == "budget_steps"
    assert result.summary.asks == 1  # routes given replace the defaults: this one lets it ask
    assert next(e for e in result.trace.events if isinstance(e, GradeEvent)).route == {"max_steps": 2}


def test_mode_env_without_a_rule_or_grader_is_refused():
    from simplan.envs.toy import ToyEnv

    with pytest.raises(InputError, match="declares no grade_request rule and no grader file"):
        Planner(
            ScriptedEngine(lambda req, text: "look"),
            ToyEnv(),
            PlannerConfig(arm="reactive", grading=GradingConfig(mode="env")),
        )


def test_fit_grader_end_to_end_and_the_planner_reads_it(tmp_path, shop_on_path):
    from simplan.data.collect import CollectConfig, collect
    from simplan.evaluation.report import write_report
    from simplan.inference.planning.trace import append_trace
    from simplan.scripts.fit_grader import main

    for fold in ("train", "dev"):
        collect(CollectConfig(env="shop", env_kwargs={"ambiguous": True}, policies=["expert"], fold=fold,
                              branches=0, out=str(tmp_path / f"{fold}.jsonl"), progress=False))  # fmt: skip
    out = tmp_path / "grader"
    assert (
        main(["--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "dev.jsonl"), "--out", str(out)]) == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train"]["grades"].keys() == {"ambiguous", "multi-step"}
    assert metrics["dev"]["n"] == 60 and metrics["dev"]["accuracy"] >= 0.95
    assert metrics["env_rule"]["accuracy"] == 1.0  # the shop's rule reads the same words
    assert "## The fitted grader on dev" in (out / "metrics.md").read_text()

    result = _run(VAGUE, {"mode": "fitted", "grader": str(out / "grader.json")})
    grade = next(e for e in result.trace.events if isinstance(e, GradeEvent))
    assert grade.by == "fitted" and grade.grade == "ambiguous" and grade.probabilities["ambiguous"] > 0.9
    append_trace(tmp_path / "run" / "traces.jsonl", result.trace)
    append_trace(
        tmp_path / "run" / "traces.jsonl", _run(PLAIN, {"mode": "fitted", "grader": str(out / "grader.json")}).trace
    )
    md = write_report([tmp_path / "run"], tmp_path / "report")["md"].read_text()
    table = md.split("### Request grades")[1].split("###")[0]
    assert "| run | reactive | multi-step | 1 | 1/1 [" in table and "| run | reactive | ambiguous | 1 | 1/1 [" in table


def test_fit_grader_names_what_it_cannot_use(tmp_path, shop_on_path):
    from simplan.data.collect import CollectConfig, collect
    from simplan.evaluation.grading_fit import FitGraderConfig, fit_grader

    path = tmp_path / "train.jsonl"
    collect(CollectConfig(env="shop", policies=["expert"], limit=2, branches=0, out=str(path), progress=False))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:  # an env this machine cannot make (imported transcripts, say)
        r["env"] = r["task"]["env"] = "elsewhere"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(InputError, match="env 'elsewhere'.*cannot be made here.*--ask_tool NAME"):
        fit_grader(FitGraderConfig(train=[str(path)], out=str(tmp_path / "g1")))
    result = fit_grader(FitGraderConfig(train=[str(path)], out=str(tmp_path / "g2"), ask_tool="none"))
    assert result["metrics"]["train"]["grades"] == {"multi-step": len(records)}
    assert "Every train request needed multi-step" in (tmp_path / "g2" / "metrics.md").read_text()
    not_trajectories = tmp_path / "traces.jsonl"
    not_trajectories.write_text('{"type": "start"}\n')
    with pytest.raises(InputError, match=r"no expert trajectory in .*1 problem\(s\) reading them, the first: .*:1:"):
        fit_grader(FitGraderConfig(train=[str(not_trajectories)], out=str(tmp_path / "g3")))


def test_routes_fitted_from_paired_runs_go_where_they_pay(tmp_path, shop_on_path):
    """A run that may ask and one that may not, on a plain request and a vague one that wants 3: the vague grade
    goes to the run that asked (it won), the plain grade to the one that did not (the same win, fewer tokens)."""
    from simplan_shop.env import ShopEnv

    from simplan.data.collect import CollectConfig, collect
    from simplan.evaluation.grading_fit import FitGraderConfig, fit_grader
    from simplan.inference.planning.grading import Grading
    from simplan.inference.planning.trace import append_trace

    vague3 = Task("shop", "shop-129", "dev", "kitchen", {"seed": 129})  # "Order some teapot(s)": the user wants 3
    routes = {"ask": {}, "noask": {"ask": False}}
    withheld = {"mode": "env", "routes": {"ambiguous": {"ask": False}, "multi-step": {"ask": False}}}
    for name, grading in (("ask", {}), ("noask", withheld)):
        for task in (PLAIN, vague3):
            append_trace(tmp_path / name / "traces.jsonl", _run(task, grading).trace)
    grader_file = tmp_path / "train.jsonl"
    collect(CollectConfig(env="shop", env_kwargs={"ambiguous": True}, policies=["expert"], limit=4, branches=0,
                          out=str(grader_file), progress=False))  # fmt: skip
    runs = {str(tmp_path / name): route for name, route in routes.items()}
    result = fit_grader(FitGraderConfig(train=[str(grader_file)], out=str(tmp_path / "g"), routes_from=runs))
    fitted = result["metrics"]["routes"]
    assert fitted["ambiguous"]["chosen"] == str(tmp_path / "ask") and fitted["ambiguous"]["route"] == {}
    multi = fitted["multi-step"]
    assert multi["chosen"] == str(tmp_path / "noask") and multi["route"] == {"ask": False}
    assert "## Routes fitted from paired runs" in (tmp_path / "g" / "metrics.md").read_text()

    grader = RequestGrader.load(tmp_path / "g" / "grader.json")  # the planner reads them from the file
    assert grader.routes == {"multi-step": {"ask": False}, "ambiguous": {}}
    env = ShopEnv(ambiguous=True)
    config = GradingConfig(mode="fitted", grader=str(tmp_path / "g" / "grader.json"))
    assert Grading.from_config(config, env).grade("Order 2 mug(s).", "").withheld == ["ask"]
    given = GradingConfig(mode="fitted", grader=config.grader, routes={"trivial": {"max_steps": 3}})
    assert Grading.from_config(given, env).grade("Order 2 mug(s).", "").withheld == ["ask"]  # the default for it
    with pytest.raises(ValueError, match="routes_from: give at least two runs"):
        FitGraderConfig(train=["x"], routes_from={"a": {}})


def test_a_route_that_gives_a_horizon_needs_the_simulator(shop_on_path):
    from simplan_shop.env import ShopEnv

    from simplan.inference.planning.grading import Grading

    routed = {"mode": "env", "routes": {"ambiguous": {"horizon": 2}}}
    assert PlannerConfig.from_dict({"arm": "reactive", "grading": routed}).simulates()
    assert not PlannerConfig.from_dict({"arm": "reactive", "grading": {**routed, "mode": "off"}}).simulates()
    grading = Grading.from_config(GradingConfig(**routed), ShopEnv(ambiguous=True))
    assert grading.simulates() and grading.grade("Order some mug(s).", "").route == {"horizon": 2}

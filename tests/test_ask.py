"""Asking the user (issue 32 item 4, `ask`): an env declares the tool that asks what the request left out
(EnvDefaults.ask_tool), answers it from the task's hidden intent, and the planner counts each question as a cost
in the trace and the report. The example shop with `ambiguous=True` leaves the quantity out of about half its
requests.

.venv/bin/pytest -q tests/test_ask.py
"""

from __future__ import annotations

import json
import re

import pytest

from simplan.envs.base import Action, Task, env_extra
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.trace import EndEvent, event_from_dict, format_event

VAGUE = Task("shop", "shop-110", "dev", "office", {"seed": 110})  # one stapler, asked for as "some"; no 503


def _shop(ambiguous: bool):
    from simplan_shop.env import ShopEnv

    return ShopEnv(ambiguous=ambiguous)


def test_an_ambiguous_request_leaves_the_quantity_to_ask_for(shop_on_path):
    from simplan_shop.env import scenario

    plain, vague = _shop(False), _shop(True)
    assert plain.reset(VAGUE).goal == "Order 1 stapler(s) of any kind and have the order shipped."
    obs = vague.reset(VAGUE)
    assert obs.goal == "Order some stapler(s) of any kind and have the order shipped."
    assert [t["name"] for t in obs.tools][-1] == "ask" and "ask" not in [t["name"] for t in plain.tools]
    assert (env_extra(plain, "ask_tool"), env_extra(vague, "ask_tool")) == (None, "ask")
    assert [g.name for g in vague.subgoals(obs.goal)] == ["order some stapler", "ship the order of some stapler"]
    answer = vague.step(Action.tool_call("ask", {"question": "How many?"}))
    assert json.loads(answer.observation.text) == {"answer": "I want 1."} and not answer.observation.error
    assert vague.step(Action.tool_call("ask", {})).observation.error  # a call without its question fails
    # the seed's other draws are those of the plain shop: the suites of the plain shop do not move
    same = {k: v for k, v in scenario(110).items() if k != "vague"}
    assert same == {"family": "office", "product": "stapler", "qty": 1, "flaky": None, "sellout": False}


def test_the_experts_ask_first_and_a_guess_can_lose(shop_on_path):
    env = _shop(True)
    obs = env.reset(VAGUE)
    assert env.expert_plan()[0] == Action.tool_call("ask", {"question": "How many staplers do you want?"})
    steps = 0
    while (action := env.expert_action(obs)) is not None:
        result = env.step(action)
        obs, steps = result.observation, steps + 1
    assert result.won and steps == 5  # ask, search, check_stock, order, ship
    env.reset(VAGUE)  # a guess of the stock shown (2) is not what the user wanted
    for name, args in [("search", {"query": "stapler"}), ("order", {"item": "stapler-mini", "qty": 2})]:
        env.step(Action.tool_call(name, args))
    assert not env.step(Action.tool_call("ship", {"order_id": "A001"})).won


def asking_decider(req, text):  # noqa: ANN001, ANN201 - ScriptedEngine's responder
    """Asks when the request says "some" and nobody answered yet, then orders what the user said."""
    said = "\n".join(m["content"] for m in req.messages)
    wanted = re.search(r"I want (\d+)", said)
    if "Order some" in said and not wanted:
        return "ask(question='How many?')"
    results = [json.loads(x) for x in re.findall(r"\{[^{}]*\}", said) if x.startswith('{"')]
    last = next((r for r in reversed(results) if {"items", "order_id", "answer"} & set(r)), {})
    if last.get("shipped"):
        return "finish()"
    if "order_id" in last:
        return f"ship(order_id='{last['order_id']}')"
    if last.get("items"):
        return f"order(item='{last['items'][0]}', qty={wanted.group(1) if wanted else 1})"
    return f"search(query='{re.search(r'Order (?:some|[0-9]+) ([a-z]+)', said).group(1)}')"


def _end(ambiguous: bool) -> tuple[EndEvent, object]:
    env = _shop(ambiguous)
    cfg = PlannerConfig.from_dict({"arm": "reactive", "raise_errors": True, "budgets": {"max_steps": 10}})
    result = Planner(ScriptedEngine(asking_decider), env, cfg).run(VAGUE)
    return event_from_dict(result.trace.to_dicts()[-1]), result


def test_a_question_is_answered_and_counted(shop_on_path):
    end, result = _end(ambiguous=True)
    assert end.success and end.asks == 1 and result.summary.asks == 1
    assert " asked=1" in format_event(end)
    plain, result = _end(ambiguous=False)  # no one to ask: not counted at all
    assert plain.success and plain.asks is None and result.summary.asks is None


def test_the_report_shows_the_questions_of_runs_that_could_ask(tmp_path, shop_on_path):
    from simplan.evaluation.report import write_report
    from simplan.inference.planning.trace import append_trace

    for name, ambiguous in (("vague", True), ("plain", False)):
        append_trace(tmp_path / name / "traces.jsonl", _end(ambiguous)[1].trace)
    md = write_report([tmp_path / "plain"], tmp_path / "plain-report")["md"].read_text()
    assert "### Questions to the user" not in md  # nobody to ask: no empty table
    md = write_report([tmp_path / "plain", tmp_path / "vague"], tmp_path / "report")["md"].read_text()
    table = md.split("### Questions to the user")[1].split("###")[0]
    assert "| vague | reactive | 1 | 1/1 | 1/1 [100" in table and "| plain |" not in table


@pytest.mark.parametrize("ambiguous", [False, True])
def test_collection_records_the_questions(tmp_path, shop_on_path, ambiguous):
    from simplan.core.io import iter_jsonl
    from simplan.data.collect import CollectConfig, collect

    out = tmp_path / "shop.jsonl"
    kwargs = {"ambiguous": ambiguous}
    collect(CollectConfig(env="simplan_shop.env:ShopEnv", env_kwargs=kwargs, policies=["expert"], limit=6,
                          branches=0, out=str(out), progress=False))  # fmt: skip
    trajs = [json.loads(line) for _, line in iter_jsonl(out)]
    asked = [t for t in trajs if t["steps"][0]["action"].get("name") == "ask"]
    assert all(t["success"] for t in trajs)
    assert (len(asked) > 0) == ambiguous


def test_envs_check_holds_the_ask_tool_to_what_the_env_offers(shop_on_path):
    from simplan.envs.check import check_env

    def ask_check(env) -> object:
        return next(r for r in check_env(env, fold_sample=1, progress=False).results if r.name == "ask tool")

    assert ask_check(_shop(False)).message == "none declared"
    good = ask_check(_shop(True))
    assert good.passed and good.message.startswith("'ask' answered on 3 tasks (e.g. '{\"answer\": \"I want")
    unoffered = _shop(False)
    unoffered.ask_tool = "ask"  # declared, but no such tool
    bad = ask_check(unoffered)
    assert not bad.passed and "ask_tool 'ask' is not among the tools (search, check_stock" in bad.message

"""Sub-goals with acceptance checks (issue 32 item 2): conditions over a belief state of facts the env extracts, the
example shop's declarations, and the planner that screens each decision's proposals against the first unmet
sub-goal, repairs a call whose arguments contradict it, pivots on a queued one, and traces all of it.

    .venv/bin/pytest -q tests/test_subgoals.py
"""

from __future__ import annotations

import json
import re

import pytest

from simplan.envs.base import Action
from simplan.envs.subgoals import Belief, Condition, Fact, SubGoal, contradicted, env_facts, unmet
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.subgoals import SUBGOAL_VIOLATION, SubgoalTracker
from simplan.inference.planning.trace import EndEvent, PivotEvent, SubgoalEvent, event_from_dict

ORDERED = SubGoal("ordered", "orders", (Condition("item", "startswith", "kettle-"), Condition("qty", "==", 1)))
SHIPPED = SubGoal("shipped", "orders", (*ORDERED.conditions, Condition("shipped", "==", True)))


def test_a_subgoal_is_met_by_one_record_and_contradicted_by_the_fields_a_record_sets():
    belief = Belief()
    assert unmet([ORDERED, SHIPPED], belief) == [ORDERED, SHIPPED]
    belief.add([Fact("orders", "A001", {"item": "kettle-steel", "qty": 2, "shipped": False})])
    assert unmet([ORDERED, SHIPPED], belief) == [ORDERED, SHIPPED]  # 2 kettles are not 1
    # shipping A001 would write shipped on a record of 2 kettles: it contradicts "ordered" by its qty
    shipping = belief.merged([Fact("orders", "A001", {"shipped": True})])
    assert [c.describe() for c in contradicted(ORDERED, shipping)] == ["qty == 1"]
    assert contradicted(ORDERED, [("orders", {"shipped": True})]) == []  # a field it does not set is not judged
    assert contradicted(ORDERED, [("stock", {"qty": 5})]) == []  # another collection
    belief.add([Fact("orders", "A002", {"item": "kettle-glass", "qty": 1, "shipped": False})])
    assert unmet([ORDERED, SHIPPED], belief) == [SHIPPED]
    belief.add([Fact("orders", "A002", {"shipped": True})])
    assert unmet([ORDERED, SHIPPED], belief) == []
    assert Condition("qty", "==", 1).holds({"qty": 1}) and not Condition("qty", ">=", 2).holds({"qty": "3"})
    with pytest.raises(ValueError, match="operator '~' is not one of"):
        Condition("qty", "~", 1)


def _shop(seed: int):
    from simplan_shop.env import ShopEnv

    from simplan.envs.base import Task

    env = ShopEnv()
    env.reset(Task("shop", f"shop-{seed}", "dev", "", {"seed": seed}))
    return env


def test_the_shops_facts_and_subgoals_follow_its_tools(shop_on_path):
    env = _shop(4)  # one kettle; no 503, no sell-out
    tracker = SubgoalTracker.start(env, "")
    assert [g.name for g in tracker.goals] == ["order 1 kettle", "ship the order of 1 kettle"]
    changes = []
    for action in env.expert_plan():
        assert tracker.rejected(action) == []  # the expert never contradicts the goal
        result = env.step(action)
        facts = env_facts(env, action, result.observation.text, result.observation.error)
        changes.append(tracker.observe(action, facts))
    assert result.won and tracker.unmet == []
    met = [c.met for c in changes if c is not None]
    assert met == [["order 1 kettle"], ["ship the order of 1 kettle"]]
    assert tracker.belief.to_dict() == {"orders": {"A001": {"item": "kettle-steel", "qty": 1, "shipped": True}}}
    # what a call intends, checked before it runs; a failed call and other tools tell nothing
    two = Action.tool_call("order", {"item": "kettle-glass", "qty": 2})
    assert env.facts(two, None, False) == [Fact("orders", None, {"item": "kettle-glass", "qty": 2, "shipped": False})]
    assert env.facts(two, '{"error": "kettle-glass sold out"}', True) == []
    assert env.facts(Action.tool_call("search", {"query": "kettle"}), '{"items": []}', False) == []
    from simplan_shop.env import ShopEnv

    assert SubgoalTracker.start(ShopEnv(declare_acceptance=False), "") is None


def test_a_contradicting_call_is_repaired_and_an_unrepairable_one_goes_last(shop_on_path):
    from simplan.inference.planning.proposals import Proposal

    tracker = SubgoalTracker.start(_shop(4), "")
    wrong = Action.tool_call("order", {"item": "kettle-steel", "qty": 2})
    assert [c.describe() for c in tracker.rejected(wrong)] == ["qty == 1"]
    assert tracker.repair(wrong, tracker.rejected(wrong)) == Action.tool_call(
        "order", {"item": "kettle-steel", "qty": 1}
    )
    teapot = Action.tool_call("order", {"item": "teapot-clay", "qty": 1})  # startswith: nothing to set
    assert tracker.repair(teapot, tracker.rejected(teapot)) is None
    search = Action.tool_call("search", {"query": "kettle"})
    ranked, event = tracker.screen(
        [Proposal(teapot), Proposal(Action(kind="finish")), Proposal(wrong), Proposal(search)]
    )
    assert [r.action for r in ranked] == [Action.tool_call("order", {"item": "kettle-steel", "qty": 1}), search,
                                          teapot, Action(kind="finish")]  # fmt: skip
    assert event.subgoal == "order 1 kettle" and event.top == "order(item='kettle-steel', qty=1)"
    assert event.repaired == {"order(item='kettle-steel', qty=2)": "order(item='kettle-steel', qty=1)"}
    assert "finish" in " ".join(event.rejected) and "item startswith 'kettle-'" in event.rejected
    assert tracker.screen([Proposal(search)]) == ([Proposal(search)], None)  # nothing contradicts: no event
    listed = {search.key(), wrong.key()}  # a complete valid-action list without the repaired call: no repair
    ranked, event = tracker.screen([Proposal(wrong), Proposal(search)], listed)
    assert [r.action for r in ranked] == [search, wrong] and event.repaired == {}
    tracker.env.facts = lambda action, observation, error: [("orders", None, {})]  # a hook that returns tuples
    with pytest.raises(TypeError, match=r"ShopEnv.facts\(\"order\(item='kettle-steel', qty=2\)\"\) returned"):
        tracker.rejected(wrong)
    del tracker.env.facts
    pivot = tracker.violation(wrong)
    assert pivot.rule == SUBGOAL_VIOLATION and pivot.fired and pivot.evidence["rejected"] == ["qty == 1"]
    assert tracker.violation(search) is None


# ---------------------------------------------------------------------------------------------
# The planner with a decider that orders as many as the stock shows (the shortcut today's shop decider learned:
# the first variant's stock equals the asked quantity in two tasks of three, bench/RESULTS.md)
def _last_result(messages: list[dict]) -> dict:
    text = "\n".join(m["content"] for m in messages if m["role"] != "system")
    results = [json.loads(x) for x in re.findall(r"\{[^{}]*\}", text)]
    results = [r for r in results if isinstance(r, dict) and {"items", "in_stock", "order_id"} & set(r)]
    return results[-1] if results else {}


def shortcut_decider(req, text):  # noqa: ANN001, ANN201 - ScriptedEngine's responder
    last = _last_result(req.messages)
    if last.get("shipped"):
        return "finish()"
    if "order_id" in last:
        return f"ship(order_id='{last['order_id']}')"
    if "in_stock" in last:
        return f"order(item='{last['item']}', qty={last['in_stock']})"
    if last.get("items"):
        return f"check_stock(item='{last['items'][0]}')"
    return "search(query='kettle')"


def shop_simulator(req, text):  # noqa: ANN001, ANN201 - what the shop answers, without its stock or faults
    name, args = re.findall(r"(search|check_stock|order|ship|finish)\((.*?)\)", text)[-1]
    values = dict(re.findall(r"(\w+)=('[^']*'|\d+)", args))
    if name == "search":
        return json.dumps({"items": ["kettle-steel", "kettle-glass"]})
    if name == "check_stock":
        return json.dumps({"item": values["item"].strip("'"), "in_stock": 2})
    if name == "order":
        return json.dumps({"order_id": "A001", "item": values["item"].strip("'"), "qty": int(values["qty"])})
    return json.dumps({"order_id": values.get("order_id", "''").strip("'"), "shipped": True})


def _run(arm: str, subgoals: bool, **planner):
    from simplan.envs.base import Task

    env = _shop(4)
    engine = ScriptedEngine(shortcut_decider, shop_simulator, lambda req, text: [0.0] * len(req.candidates))
    cfg = PlannerConfig.from_dict({"arm": arm, "subgoals": subgoals, "budgets": {"max_steps": 12}, **planner})
    result = Planner(engine, env, cfg).run(Task("shop", "shop-4", "dev", "kitchen", {"seed": 4}))
    return result, [event_from_dict(e) for e in result.trace.to_dicts()]


def test_the_planner_repairs_the_shortcut_order_and_wins(shop_on_path):
    assert PlannerConfig(arm="reactive").subgoals and PlannerConfig(arm="simplan").subgoals  # on in every arm
    off, off_events = _run("reactive", subgoals=False)
    assert not off.summary.success
    assert [e.action for e in off_events if e.type == "act"][-2:] == ["ship(order_id='A001')", "finish()"]
    assert [e for e in off_events if isinstance(e, SubgoalEvent)] == []
    assert next(e for e in off_events if isinstance(e, EndEvent)).unmet is None

    on, events = _run("reactive", subgoals=True)
    assert on.summary.success
    acts = [e.action for e in events if e.type == "act"]
    assert acts == ["search(query='kettle')", "check_stock(item='kettle-steel')", "order(item='kettle-steel', qty=1)",
                    "ship(order_id='A001')"]  # fmt: skip
    screen = next(e for e in events if isinstance(e, SubgoalEvent) and e.check == "screen")
    assert screen.repaired == {"order(item='kettle-steel', qty=2)": "order(item='kettle-steel', qty=1)"}
    steps = [e.met for e in events if isinstance(e, SubgoalEvent) and e.check == "step"]
    assert steps == [["order 1 kettle"], ["ship the order of 1 kettle"]]
    assert next(e for e in events if isinstance(e, EndEvent)).unmet == []
    assert (on.summary.subgoal_screens, on.summary.subgoal_repairs, on.summary.subgoals_unmet) == (1, 1, 0)
    assert (off.summary.subgoal_screens, off.summary.subgoals_unmet) == (0, None)
    # A lost episode that tracked them says where it stood (evaluation/losses.py), and the report counts them.
    from simplan.evaluation.losses import classify_loss
    from simplan.evaluation.metrics import episode_record, group_metrics

    stuck, _ = _run("reactive", subgoals=True, budgets={"max_steps": 2})
    assert classify_loss(stuck.trace).evidence.endswith("; unmet: order 1 kettle, ship the order of 1 kettle")
    m = group_metrics("reactive", "", [episode_record(on.trace), episode_record(stuck.trace)])
    assert (m.subgoal_screens, m.subgoal_repairs, m.subgoal_episodes, m.unmet_episodes) == (1, 1, 2, 1)


def test_a_queued_call_that_contradicts_the_subgoal_is_a_pivot_before_it_runs(shop_on_path):
    # Always simulating with horizon 3: the first plan is search, check_stock, then the imagined order of 2.
    on, events = _run("simplan-always", subgoals=True, pivot_rules={"mismatch_threshold": 0.0})
    assert on.summary.success
    pivots = [e for e in events if isinstance(e, PivotEvent) and e.rule == SUBGOAL_VIOLATION]
    assert len(pivots) == 1 and pivots[0].evidence["action"] == "order(item='kettle-steel', qty=2)"
    acts = [e for e in events if e.type == "act"]
    assert "order(item='kettle-steel', qty=2)" not in [a.action for a in acts]  # never ran
    assert pivots[0].step == 2 and acts[2].action == "order(item='kettle-steel', qty=1)"
    replan = next(e for e in events if e.type == "replan")
    assert replan.reason == SUBGOAL_VIOLATION


def test_envs_check_holds_the_subgoals_to_the_expert(shop_on_path):
    from simplan_shop.env import ShopEnv

    from simplan.envs.check import check_env
    from simplan.envs.toy import ToyEnv

    def result(env) -> tuple[bool, str]:  # noqa: ANN001
        report = check_env(env, fold_sample=1, progress=False)
        row = next(r for r in report.results if r.name == "sub-goals")
        return row.passed, row.message

    assert result(ShopEnv()) == (True, "the expert meets 6 sub-goals on 3 tasks and contradicts none")
    ok, message = result(ToyEnv())  # facts for the snapshot, no sub-goals
    assert ok and re.fullmatch(r"no sub-goals; facts: [1-9]\d* from \d+ expert steps on \d+ tasks .*", message)

    class OffByOne(ShopEnv):  # sub-goals that ask for one more than the task does
        def subgoals(self, goal):  # noqa: ANN001, ANN201
            return [SubGoal(g.name, g.collection, (*g.conditions[:1], Condition("qty", "==", self._s["qty"] + 1)))
                    for g in super().subgoals(goal)]  # fmt: skip

    ok, message = result(OffByOne())
    assert not ok and "the sub-goals disagree with the expert" in message and "fails qty ==" in message

    class Half(ShopEnv):
        facts = None

    ok, message = result(Half())
    assert not ok and "declare `facts` too" in message


def test_the_report_counts_the_subgoals_of_the_runs_that_tracked_them(tmp_path, shop_on_path):
    from simplan.evaluation.report import write_report
    from simplan.inference.planning.trace import append_trace

    on, off = tmp_path / "on", tmp_path / "off"
    for folder, subgoals in ((on, True), (off, False)):
        for arm in ("reactive", "simplan"):
            result, _ = _run(arm, subgoals=subgoals)
            append_trace(folder / "traces.jsonl", result.trace)
    md = write_report([off], tmp_path / "off-report")["md"].read_text()
    assert "### Sub-goals" not in md  # nothing tracked: no empty table
    main = write_report([off, on], tmp_path / "report")["md"].read_text().split("## Plots")[0]
    table = main.split("### Sub-goals")[1].split("###")[0]
    assert "| on | reactive | 1 | 1 | 0/1 |" in table and "| off |" not in table


def test_facts_that_depart_from_the_expected_ones_fire_fact_mismatch(shop_on_path):
    from simplan.envs.subgoals import fact_differences

    assert fact_differences([Fact("orders", "A009", {"qty": 1})], [Fact("orders", "A001", {"qty": 1})]) == [
        "orders: expected key 'A009', got 'A001'"
    ]
    assert fact_differences([Fact("orders", None, {"qty": 2})], [Fact("orders", "A001", {"qty": 1})]) == [
        "orders A001.qty: expected 2, got 1"
    ]
    assert fact_differences([Fact("orders", "A001", {"qty": 1})], []) == [
        "orders: expected {'qty': 1}, nothing written"
    ]
    assert fact_differences([], [Fact("orders", "A001", {"qty": 1})]) == []  # the prediction said less: no claim

    def wrong_id(req, text):  # noqa: ANN001, ANN201 - the simulator, with another order id than the shop gives
        return shop_simulator(req, text).replace('"A001"', '"A009"')

    def run(on: bool):
        from simplan.envs.base import Task

        env = _shop(4)
        engine = ScriptedEngine(shortcut_decider, wrong_id, lambda req, text: [0.0] * len(req.candidates))
        cfg = PlannerConfig.from_dict(
            {"arm": "simplan-always", "budgets": {"max_steps": 12}, "pivot_rules": {"fact_mismatch": on}}
        )
        result = Planner(engine, env, cfg).run(Task("shop", "shop-4", "dev", "kitchen", {"seed": 4}))
        return result, [event_from_dict(e) for e in result.trace.to_dicts()]

    on, events = run(True)
    fired = [e for e in events if isinstance(e, PivotEvent) and e.rule == "fact_mismatch"]
    assert on.summary.success and len(fired) == 1
    assert fired[0].evidence["differences"] == ["orders: expected key 'A009', got 'A001'"]
    acts = [e.action for e in events if e.type == "act"]
    assert "ship(order_id='A009')" not in acts and acts[-1] == "ship(order_id='A001')"  # the queued ship dropped
    off, events = run(False)
    acts = [e.action for e in events if e.type == "act"]
    assert off.summary.success and "ship(order_id='A009')" in acts  # word overlap let the plan run into it
    assert not [e for e in events if isinstance(e, PivotEvent) and e.rule == "fact_mismatch"]

"""A small tool-calling shop: find a product, check stock, order it, ship the order.

    pip install -e examples/simplan-shop              # registers `shop` (entry point simplan.envs)
    simplan envs check shop
    simplan collect --env shop --fold train --policies expert --limit 10 --out runs/data/shop.jsonl
    simplan envs check simplan_shop.env:ShopEnv       # the same without installing (folder on PYTHONPATH)

Tools (JSON schemas in `Observation.tools`): search(query), check_stock(item), order(item, qty),
ship(order_id), finish(). Observations are the tool's JSON result; errors are `{"error": ...}` with
`Observation.error` set. The episode is won when an order of the requested product, in the requested
quantity, is shipped; `finish()` ends it as it stands.

Every task is a seed (train 0-59, dev 100-159, test 200-219); from the seed, deterministically:
the product and quantity asked for; in some tasks one tool answers "503 service unavailable" the
first time it is called (nothing happens; the same call then succeeds); in some tasks the first
variant of the product sells out between `check_stock` and `order`, so another variant must be ordered.
`expert_plan()` is the fixed path through all of that, retry and substitute included; `expert_action()` is
an expert that reacts to what the tools answered (it repeats a call after a 503, checks and orders the next
variant after "sold out"), so it recovers from whatever a noisy step or an injected fault did.

Failure classes (envs/base.py EnvDefaults): a 503 is transient (retry the same call), a sold-out item
changes the plan (replan); `finish()` is accepted only once the order is shipped (`accepts`, and
`accept_patterns` for a predicted finish outcome). Sub-goals (`subgoals`, over the orders `facts` reads from
the tools' results): an order of the product in the asked quantity, then that order shipped.
`ShopEnv(declare_acceptance=False)` declares none of these (`--env_kwargs '{declare_acceptance: false}'`), to
measure an env that leaves a premature finish to the planner.

`ShopEnv(ambiguous=True)` (`--env_kwargs '{ambiguous: true}'`): about half the requests say "Order some
kettle(s)": the quantity is the user's hidden intent, told by a sixth tool, ask(question) (the env's `ask_tool`:
the planner counts its calls as a cost); only an order of that quantity wins. The experts ask first. The shop
grades a request (`grade_request`, read with the planner's `grading.mode: env`): ambiguous when it names no
quantity and someone can be asked, else multi-step.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from simplan.envs.actions import parse_tool_call
from simplan.envs.base import Action, EnvDefaults, Observation, StepResult, Task
from simplan.envs.subgoals import Condition, Fact, SubGoal

# dev has 60 tasks (19-22 per family; 50 with a 503, 28 with a sell-out) so that a paired evaluation on at least
# 40 of them (recipes/suites/shop-dev-faults.yaml) can tell arms apart.
FOLD_SEEDS = {"train": range(0, 60), "dev": range(100, 160), "test": range(200, 220)}
CATALOG: dict[str, dict[str, list[str]]] = {  # family -> product -> variants (the items you can order)
    "kitchen": {"kettle": ["kettle-steel", "kettle-glass"], "teapot": ["teapot-clay", "teapot-iron"]},
    "outdoor": {"tent": ["tent-2p", "tent-4p"], "lantern": ["lantern-led", "lantern-gas"]},
    "office": {"stapler": ["stapler-mini", "stapler-heavy"], "lamp": ["lamp-desk", "lamp-clip"]},
}
FLAKY_TOOLS = (None, "search", "check_stock", "order", "ship")
SERVICE_UNAVAILABLE = "503 service unavailable: try again"


def _param(kind: str, text: str) -> dict[str, str]:
    return {"type": kind, "description": text}


TOOLS: list[dict[str, Any]] = [
    {"name": "search", "description": "Find items for sale whose name matches a word.",
     "parameters": {"type": "object", "properties": {"query": _param("string", "a product word, e.g. 'kettle'")},
                    "required": ["query"]}},
    {"name": "check_stock", "description": "How many of an item are in stock.",
     "parameters": {"type": "object", "properties": {"item": _param("string", "an item name from search")},
                    "required": ["item"]}},
    {"name": "order", "description": "Order qty of an item; returns an order id.",
     "parameters": {"type": "object", "properties": {"item": _param("string", "an item name from search"),
                                                     "qty": _param("integer", "how many")},
                    "required": ["item", "qty"]}},
    {"name": "ship", "description": "Ship an order.",
     "parameters": {"type": "object", "properties": {"order_id": _param("string", "the id order returned")},
                    "required": ["order_id"]}},
    {"name": "finish", "description": "End the session.", "parameters": {"type": "object", "properties": {}}},
]  # fmt: skip
# `ShopEnv(ambiguous=True)`: some requests leave out the quantity, and one more tool asks the user for it.
ASK_TOOL = {
    "name": "ask",
    "description": "Ask the user about something the request leaves out; returns their answer.",
    "parameters": {"type": "object", "properties": {"question": _param("string", "the question")},
                   "required": ["question"]},
}  # fmt: skip


def scenario(seed: int) -> dict[str, Any]:
    """What a seed decides: family, product, quantity, the flaky tool (or None), and a sell-out."""
    rng = random.Random(f"simplan-shop:{seed}")
    family = rng.choice(sorted(CATALOG))
    product = rng.choice(sorted(CATALOG[family]))
    return {
        "family": family,
        "product": product,
        "qty": rng.randint(1, 3),
        "flaky": rng.choice(FLAKY_TOOLS),  # 4 of 5 tasks have one 503
        "sellout": rng.random() < 0.4,
        "vague": rng.random() < 0.5,  # with `ambiguous`: the request leaves the quantity out (drawn last: the
    }  # draws above are the same with and without it)


class ShopEnv(EnvDefaults):
    """A tool-calling shop: search, check_stock, order, ship; transient 503s and items that sell out."""

    name = "shop"
    families = tuple(sorted(CATALOG))
    error_patterns = (r'"error"',)
    transient_patterns = (r"\b503\b", r"temporarily unavailable", r"\btry again\b")
    replan_patterns = (r"\bsold out\b", r"\bout of stock\b", r"\bonly \d+ in stock\b")
    accept_patterns = (r'"shipped": true',)

    def __init__(self, declare_acceptance: bool = True, ambiguous: bool = False, can_ask: bool = True) -> None:
        """`declare_acceptance=False`: the shop without `accepts` and `accept_patterns`, as a user's first plugin
        often is, to measure what the planner does about a premature `finish()` with no env verdict to read.
        `ambiguous=True`: about half the requests leave the quantity out ("Order some kettles ..."), the user's
        hidden intent, which the tool `ask(question)` (the env's `ask_tool`) answers; only an order of that
        quantity wins. The sub-goals of such a request name no quantity (the request does not). `can_ask=False`:
        the same requests with no one to ask (no `ask` tool), to measure what asking buys."""
        self._task: Task | None = None
        self.ambiguous = ambiguous
        asking = ambiguous and can_ask
        self.tools = [*TOOLS, ASK_TOOL] if asking else TOOLS
        self.tool_names = [t["name"] for t in self.tools]
        self.ask_tool = "ask" if asking else None
        if not declare_acceptance:
            self.accepts = None  # type: ignore[assignment]  (the EnvDefaults default: no verdict)
            self.accept_patterns = ()
            self.subgoals = None  # type: ignore[assignment]

    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        if fold not in FOLD_SEEDS:
            raise ValueError(f"fold {fold!r}: expected one of {sorted(FOLD_SEEDS)}")
        out = []
        for seed in FOLD_SEEDS[fold]:
            family = scenario(seed)["family"]
            if not families or family in families:
                out.append(Task(self.name, f"shop-{seed}", fold, family, {"seed": seed}))
        return out[:limit] if limit is not None else out

    def reset(self, task: Task) -> Observation:
        self._task, self._s = task, scenario(int(task.params["seed"]))
        variants = CATALOG[self._s["family"]][self._s["product"]]
        self._stock = {item: 5 for items in CATALOG.values() for v in items.values() for item in v}
        self._stock[variants[0]] = max(self._s["qty"], 2)
        self._checked: set[str] = set()
        self._orders: dict[str, dict[str, Any]] = {}
        self._failed_once = False
        self._done = self._won = False
        # What the tools have answered this episode (never the hidden stock): all the reacting expert knows.
        self._items: list[str] = []
        self._seen_stock: dict[str, int] = {}
        self._unavailable: set[str] = set()
        self._placed: dict[str, tuple[str, int]] = {}
        self._shipped: set[str] = set()
        self._vague = self.ambiguous and self._s["vague"]
        self._told = False  # the user has told the quantity (an `ask` answered)
        amount = "some" if self._vague else str(self._s["qty"])
        self._goal = f"Order {amount} {self._s['product']}(s) of any kind and have the order shipped."
        return Observation(text=f"User: {self._goal}", goal=self._goal, tools=self.tools)

    def step(self, action: Action) -> StepResult:
        if self._task is None:
            raise RuntimeError("ShopEnv.step called before reset")
        if self._done:
            return self._result({"error": "the session is over"}, error=True)
        if action.kind == "finish" or (action.kind == "tool_call" and action.name == "finish"):
            self._done = True
            return self._result({"finished": True, "shipped": self._won})
        if action.kind != "tool_call" or action.name not in self.tool_names:
            error = f"unknown tool {action.key()!r}; tools: {', '.join(self.tool_names)}"
            return self._result({"error": error}, True)
        if action.name == self._s["flaky"] and not self._failed_once:
            self._failed_once = True  # the service is down for exactly this one call
            return self._result({"error": SERVICE_UNAVAILABLE}, error=True)
        try:
            result = getattr(self, f"_{action.name}")(**action.arguments)
        except TypeError as e:  # missing or unknown arguments
            return self._result({"error": f"{action.name}: {e}"}, error=True)
        self._learn(action, result)
        return self._result(result, error="error" in result)

    def _learn(self, action: Action, result: dict[str, Any]) -> None:
        args = action.arguments
        if "error" in result:
            if action.name == "order" and re.search(r"sold out|only \d+ in stock", str(result["error"])):
                self._unavailable.add(str(args.get("item")))
        elif action.name == "search":
            self._items = list(dict.fromkeys(self._items + result["items"]))
        elif action.name == "check_stock":
            self._seen_stock[result["item"]] = int(result["in_stock"])
        elif action.name == "order":
            self._placed[result["order_id"]] = (result["item"], result["qty"])
        elif action.name == "ship":
            self._shipped.add(result["order_id"])
        elif action.name == "ask":
            self._told = True

    def _search(self, query: str) -> dict[str, Any]:
        q = str(query).strip().lower()
        hits = [item for items in CATALOG.values() for v in items.values() for item in v if q and q in item]
        return {"items": hits}

    def _check_stock(self, item: str) -> dict[str, Any]:
        if item not in self._stock:
            return {"error": f"no item {item!r}; use search"}
        in_stock = self._stock[item]
        first = CATALOG[self._s["family"]][self._s["product"]][0]
        if self._s["sellout"] and item == first and item not in self._checked:
            self._stock[item] = 0  # another buyer takes them all right after this answer
        self._checked.add(item)
        return {"item": item, "in_stock": in_stock}

    def _order(self, item: str, qty: int) -> dict[str, Any]:
        if item not in self._stock:
            return {"error": f"no item {item!r}; use search"}
        if not isinstance(qty, int) or isinstance(qty, bool) or qty < 1:
            return {"error": f"qty must be a positive integer, got {qty!r}"}
        if self._stock[item] < qty:
            return {"error": f"{item} sold out" if not self._stock[item] else f"only {self._stock[item]} in stock"}
        self._stock[item] -= qty
        order_id = f"A{len(self._orders) + 1:03d}"
        self._orders[order_id] = {"item": item, "qty": qty, "shipped": False}
        return {"order_id": order_id, "item": item, "qty": qty}

    def _ask(self, question: str) -> dict[str, Any]:
        """The user's answer: the quantity they want, whatever the question (the one thing a request leaves out)."""
        return {"answer": f"I want {self._s['qty']}."}

    def _ship(self, order_id: str) -> dict[str, Any]:
        order = self._orders.get(order_id)
        if order is None or order["shipped"]:
            return {"error": f"no open order {order_id!r}"}
        order["shipped"] = True
        variants = CATALOG[self._s["family"]][self._s["product"]]
        self._won = order["item"] in variants and order["qty"] == self._s["qty"]
        self._done = self._done or self._won
        return {"order_id": order_id, "shipped": True}

    def _result(self, result: dict[str, Any], error: bool = False) -> StepResult:
        obs = Observation(text=json.dumps(result), goal=self._goal, tools=self.tools, error=error)
        score = 1.0 if self._won else 0.5 if self._orders else 0.0
        return StepResult(obs, score=score, done=self._done, won=self._won, info={"tasksuccess": self._won})

    def accepts(self) -> bool:
        """The goal is met: an order of the requested product and quantity is shipped."""
        return self._won

    def grade_request(self, goal: str, observation: str) -> str:
        """The request's grade (data/grades.py) from its words alone: one that names no quantity is ambiguous where
        someone can be asked; every other takes several calls (search, order, ship)."""
        vague = self.ask_tool is not None and re.match(r"Order some\b", goal) is not None
        return "ambiguous" if vague else "multi-step"

    def subgoals(self, goal: str) -> list[SubGoal]:
        """The goal's two steps: an order of one of the product's variants in the asked quantity, then that
        order shipped (records of `orders`, written by `facts`)."""
        if self._task is None:
            raise RuntimeError("ShopEnv.subgoals called before reset")
        product, qty = self._s["product"], self._s["qty"]
        # a request that names no quantity: neither do its steps
        amount = "some" if self._vague else str(qty)
        order = (
            Condition("item", "startswith", f"{product}-"),
            *(() if self._vague else (Condition("qty", "==", qty),)),
        )
        return [
            SubGoal(f"order {amount} {product}", "orders", order),
            SubGoal(f"ship the order of {amount} {product}", "orders", (*order, Condition("shipped", "==", True))),
        ]

    def facts(self, action: Action | None, observation: str | None, error: bool) -> list[Fact]:
        """An order placed (its item and qty) or shipped, keyed by order id; with `observation=None`, the order
        or shipment the call would make. Nothing from a failed call, any other tool or the reset (`action` None)."""
        if action is None or action.kind != "tool_call" or action.name not in ("order", "ship") or error:
            return []
        args = action.arguments
        if observation is None:  # the call's intent
            if action.name == "order":
                return [Fact("orders", None, {"item": args.get("item"), "qty": args.get("qty"), "shipped": False})]
            return [Fact("orders", str(args.get("order_id")), {"shipped": True})]
        try:
            result = json.loads(observation)
        except ValueError:
            return []
        if not isinstance(result, dict) or "error" in result or "order_id" not in result:
            return []
        if action.name == "order":
            fields = {"item": result.get("item"), "qty": result.get("qty"), "shipped": False}
            return [Fact("orders", str(result["order_id"]), fields)]
        return [Fact("orders", str(result["order_id"]), {"shipped": bool(result.get("shipped"))})]

    def expert_action(self, observation: Observation) -> Action | None:
        """The next call of an expert that knows only what the tools answered: ship a placed order of the
        product, else search, check and order its first variant not known to be unavailable. A failed call
        taught it nothing, so after a 503 it makes the same call again."""
        if self._task is None or self._done:
            return None
        product, qty = self._s["product"], self._s["qty"]
        if self._vague and not self._told and self.ask_tool:
            return self._question()
        for order_id, (item, n) in self._placed.items():
            if order_id not in self._shipped and item.startswith(f"{product}-") and n == qty:
                return Action.tool_call("ship", {"order_id": order_id})
        variants = [item for item in self._items if item.startswith(f"{product}-")]
        if not variants:
            return Action.tool_call("search", {"query": product})
        for item in variants:
            if item in self._unavailable:
                continue
            if item not in self._seen_stock:
                return Action.tool_call("check_stock", {"item": item})
            if self._seen_stock[item] >= qty:
                return Action.tool_call("order", {"item": item, "qty": qty})
        return Action(kind="finish")  # nothing left to try

    def expert_plan(self) -> list[Action]:
        """The fixed winning path from the reset state: the quantity asked for where the request leaves it out, the
        503 retried, a sold-out variant replaced."""
        s = self._s
        first, second = CATALOG[s["family"]][s["product"]]
        item = second if s["sellout"] else first
        calls: list[tuple[str, dict[str, Any]]] = [("search", {"query": s["product"]})]
        calls.append(("check_stock", {"item": first}))
        if s["sellout"]:
            calls += [("order", {"item": first, "qty": s["qty"]}), ("check_stock", {"item": second})]
        calls += [("order", {"item": item, "qty": s["qty"]}), ("ship", {"order_id": "A001"})]
        if s["flaky"] is not None:  # the first call to the flaky tool fails: repeat it
            at = next(i for i, (name, _) in enumerate(calls) if name == s["flaky"])
            calls.insert(at, calls[at])
        asked = [self._question()] if self._vague and self.ask_tool else []  # (the ask tool is never the flaky one)
        return asked + [Action.tool_call(name, args) for name, args in calls]

    def _question(self) -> Action:
        """The expert's question when the request leaves the quantity out."""
        return Action.tool_call("ask", {"question": f"How many {self._s['product']}s do you want?"})

    def parse_action(self, text: str) -> Action:
        return parse_tool_call(text, allowed=self.tool_names)

    def close(self) -> None:
        self._task = None

"""The compared agents ("arms") as presets of the one planning loop (inference/planning/planner.py).

    reactive  K=1, H=0: the decider picks each action from the real state; no simulation, no pivots
              (the episode still ends on its step/token budgets).
    reactive-pivots  reactive with simplan's pivot rules (errors, repeats, no progress, score drops, budgets: the
              rules that need no simulator) and what they do (ban the action where it failed, replan): simplan
              without imagination, so simplan - reactive-pivots is what the simulator itself adds.
    plan      open-loop plan-then-execute: imagine K rollouts of H steps, commit the best one and execute
              all of it without watching; plan again only when the queue is empty.
    simplan   simulate + pivot: imagine, commit, execute while reality matches the expectations, pivot
              (drop the queue, note the failure, replan) when a rule fires; skip simulation when the
              decider is confident (adaptive horizon).
    simplan-oracle  simplan whose simulator is the real env replayed (`simulator: env`, inference/planning/oracle.py):
              how much a perfect simulator would buy; not among `simplan eval`'s default arms.
    simplan-always  simplan that simulates every decision (no adaptive skip): the baseline of the router.
    simplan-router  simplan with the selective router (`router.mode: selective`): simulate where the simulator's
              measured accuracy on the verb or an unsure decider says it can pay, act reactively elsewhere;
              needs the simulator's simulator_accuracy.json (inference/planning/sim_accuracy.py).

A preset fills only the PlannerConfig fields left at None, so `--arm simplan --horizon 5` keeps
the flag. `simplan run --arm NAME --help` lists every field.
"""

from __future__ import annotations

from typing import Any

ARM_PRESETS: dict[str, dict[str, Any]] = {
    "reactive": {"k": 1, "horizon": 0, "pivots": False, "adaptive": False},
    # The ablation that isolates the simulator: the pivots without imagination (an expectation never exists, so the
    # mismatch rules never fire).
    "reactive-pivots": {"k": 1, "horizon": 0, "pivots": True, "adaptive": False},
    "plan": {"k": 3, "horizon": 5, "pivots": False, "adaptive": False},
    "simplan": {"k": 3, "horizon": 3, "pivots": True, "adaptive": True},
    # The ablation's upper bound: simplan whose imagination is answered by the real env (inference/planning/oracle.py).
    "simplan-oracle": {"k": 3, "horizon": 3, "pivots": True, "adaptive": True, "simulator": "env"},
    # The router's comparison (issue: trust the simulator where it is right): always simulate vs selective.
    "simplan-always": {"k": 3, "horizon": 3, "pivots": True, "adaptive": False},
    "simplan-router": {"k": 3, "horizon": 3, "pivots": True, "adaptive": False, "router.mode": "selective"},
}
ARMS: tuple[str, ...] = tuple(ARM_PRESETS)
PIVOTS_ABLATION = "reactive-pivots"  # simplan without imagination: the report compares the imagining arms with it


def arm_preset(name: str) -> dict[str, Any]:
    if name not in ARM_PRESETS:
        raise ValueError(f"arm: {name!r} is not one of {', '.join(ARMS)}")
    return dict(ARM_PRESETS[name])

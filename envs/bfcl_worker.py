"""BFCL tool execution for envs/bfcl.py: what runs in the episode's worker process, and the text of calls.

    from simplan.envs.bfcl_worker import _w_execute, _w_open, argument_problem, call_string, render_result
    worker.call(_w_open, entry, long_context, model_name, calls_so_far, gt_turns, timeout=60)
    if argument_problem(action) is None:
        text = render_result(worker.call(_w_execute, call_string(action), timeout=10))

The `_w_*` functions run inside the `envs.limits.WorkerProcess` of one episode (their names show in its
timeout messages): `_w_open` creates the episode's backend instances (bfcl caches them in its module
globals, keyed by model name + task id) and replays the calls so far, `_w_execute` runs one call through
bfcl's `execute_multi_turn_func_call`, `_w_check_turn` and `_w_final_verdict` run bfcl's checkers. In the
env's own process: `call_string` rebuilds the string bfcl eval()s from a structured Action (`repr()` of
each literal), `render_result` turns a result into observation text, `is_error_result` tells an error
result, and `argument_problem` refuses the arguments known to hang or flood bfcl's MathAPI.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from simplan.envs.base import Action
from simplan.envs.bfcl_tasks import BFCLEntry, missing_package_error

try:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
        multi_turn_checker,
        response_checker,
        state_checker,
    )
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise missing_package_error(e) from e

# Argument bounds of the MathAPI (the ground truth uses precision <= 10 and no power): measured,
# logarithm(precision=300000) takes 76 s, square_root(precision=1000000) returns a 1 MB result, and
# power(base=3, exponent=1000000000) runs for minutes.
MAX_PRECISION = 1000  # digits
MAX_POWER_BITS = 100_000  # bits of an integer power's result (3**63000 has ~100,000)


def is_error_result(result: str) -> bool:
    if result.startswith("Error during execution"):
        return True
    if result.startswith("{"):
        try:
            parsed = json.loads(result)
        except ValueError:
            return False
        return isinstance(parsed, dict) and "error" in parsed
    return result.startswith("{'error'")  # a dict bfcl could not JSON-encode falls back to str()


def render_result(result: str) -> str:
    """A bfcl execution result as observation text: compact JSON for JSON results, else verbatim."""
    if result.startswith(("{", "[")):
        try:
            return json.dumps(json.loads(result), ensure_ascii=False, separators=(",", ":"))
        except ValueError:
            pass
    return result


def _check_summary(result: dict[str, Any]) -> dict[str, Any]:
    """bfcl checker verdicts without their (possibly huge) state dumps."""
    return {k: result[k] for k in ("valid", "error_type", "error_message") if k in result}


def call_string(action: Action) -> str:
    """The string handed to bfcl's executor: `name(key=repr(value), ...)` from a structured Action."""
    return f"{action.name}({', '.join(f'{key}={value!r}' for key, value in action.arguments.items())})"


def _drop_instances(model_name: str) -> None:
    """Delete the backend instances bfcl cached in its module globals for this model name."""
    prefix = re.sub(r"[-./:]", "_", model_name) + "_"
    cache = vars(multi_turn_utils)
    for key in [k for k in list(cache) if k.startswith(prefix)]:
        cache.pop(key, None)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def argument_problem(action: Action) -> str | None:
    """Why a call's arguments would hang or flood bfcl's MathAPI (see MAX_PRECISION, MAX_POWER_BITS), or None.

    Comparisons only, never float() of an argument: an integer literal may be too large for a float."""
    args = action.arguments
    if action.name in ("logarithm", "square_root"):
        precision = args.get("precision")
        if _is_number(precision) and abs(precision) > MAX_PRECISION:
            return f"{action.name}: precision is above the {MAX_PRECISION} digits allowed"
    if action.name == "power":
        base, exponent = args.get("base"), args.get("exponent")
        exact = all(isinstance(v, int) and not isinstance(v, bool) for v in (base, exponent))
        if exact and abs(base) > 1 and exponent > MAX_POWER_BITS / math.log2(abs(base)):
            return f"power: the result would have more than {MAX_POWER_BITS:,} bits; use a smaller exponent"
    return None


# ---------------------------------------------------------------------------------------------
# The worker process's side: one episode's backend instances, in bfcl's module globals
# ---------------------------------------------------------------------------------------------
_EPISODE: dict[str, Any] = {}  # set by _w_open in the worker; never used in the env's own process


def _bfcl_execute(calls: list[str], model_name: str) -> tuple[list[str], dict[str, Any]]:
    entry: BFCLEntry = _EPISODE["entry"]
    return execute_multi_turn_func_call(
        calls,
        entry.initial_config,
        entry.involved_classes,
        model_name,
        entry.id,
        long_context=_EPISODE["long_context"],
        is_evaL_run=False,
    )


def _w_open(entry: BFCLEntry, long_context: bool, model_name: str, calls: list[str], gt_turns: int) -> list[str]:
    """Create the episode's instances, replay `calls` and the ground truth of the first `gt_turns` turns;
    returns the replayed calls' results."""
    _EPISODE.clear()
    _EPISODE.update(entry=entry, long_context=long_context, model=model_name, gt=f"{model_name}_groundtruth")
    results, _ = _bfcl_execute(calls, model_name)
    if gt_turns:
        _bfcl_execute([c for turn in entry.ground_truth[:gt_turns] for c in turn], _EPISODE["gt"])
    return results


def _w_execute(call: str) -> str:
    """One model call against the episode's instances."""
    results, _ = _bfcl_execute([call], _EPISODE["model"])
    return results[0]


def _w_check_turn(turn: int, all_results: list[str], made_calls: bool) -> dict[str, Any] | None:
    """Run the turn's ground truth, then bfcl's state and response checkers (None for an unchecked turn)."""
    ground_truth = _EPISODE["entry"].ground_truth[turn]
    gt_results, gt_instances = _bfcl_execute(ground_truth, _EPISODE["gt"])
    if not ground_truth:
        return None
    if not made_calls:
        return {
            "valid": False,
            "error_type": "multi_turn:empty_turn_model_response",
            "error_message": f"Model response list is empty for turn {turn}",
        }
    _, instances = _bfcl_execute([], _EPISODE["model"])
    check = state_checker(instances, gt_instances)
    if check["valid"]:
        check = response_checker(all_results, gt_results, turn)
    return _check_summary(check)


def _w_final_verdict(turn_calls: list[list[str]]) -> dict[str, Any]:
    """bfcl-eval's multi_turn_checker over the whole episode (fresh instances, then dropped)."""
    entry: BFCLEntry = _EPISODE["entry"]
    name = f"{_EPISODE['model']}_final"
    decoded = [[[call] for call in calls] for calls in turn_calls]
    try:
        verdict = multi_turn_checker(decoded, entry.ground_truth, entry.bfcl_entry(), entry.category, name)
    except AssertionError as e:  # bfcl asserts on inconsistent instance sets
        verdict = {"valid": False, "error_type": "multi_turn:checker_assertion", "error_message": str(e)}
    finally:
        _drop_instances(name)
    return _check_summary(verdict)


__all__ = ["argument_problem", "call_string", "render_result"]

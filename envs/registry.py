"""Name -> environment factory. Adapters register themselves; `simplan envs list` shows them.

To add an environment: implement `envs.base.Env` in one file and add one line to `_BUILTIN`
(or call `register(name, factory)` from your own code before running simplan).

Every env `make_env` returns wears `envs.limits.LimitedEnv`: a wall-clock limit per step and a cap on
observation length, set with the `step_timeout` and `max_observation_chars` kwargs (envs/limits.py).
`env.unwrapped` is the adapter itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from simplan.envs.base import Env
from simplan.envs.limits import LimitedEnv, make_limited

# name -> "module:factory". Imported lazily so listing envs needs no JVM and no optional package.
_BUILTIN: dict[str, str] = {
    "twx": "simplan.envs.textworld_express:TextWorldExpressEnv",
    "scienceworld": "simplan.envs.scienceworld:ScienceWorldEnv",
    "bfcl": "simplan.envs.bfcl:BFCLEnv",
    "toy": "simplan.envs.toy:ToyEnv",
}
_REGISTERED: dict[str, Callable[..., Env]] = {}


def register(name: str, factory: Callable[..., Env]) -> None:
    _REGISTERED[name] = factory


def names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def make_env(name: str, **kwargs: Any) -> LimitedEnv:
    """Build an environment by registered name under step limits; other kwargs go to the adapter's constructor.

    `step_timeout` (seconds per step, 0 = none) and `max_observation_chars` (0 = no cap) are the limits'
    (envs/limits.py); an adapter that takes `step_timeout` itself (BFCL) receives it instead.
    """
    return make_limited(_factory(name), kwargs)


def _factory(name: str) -> Callable[..., Env]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _BUILTIN:
        raise KeyError(f"unknown environment {name!r}; registered: {', '.join(names())}")
    module_name, _, attr = _BUILTIN[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("simplan"):
            raise  # our own code is broken, not the set-up: show the real error
        raise ImportError(
            f"environment {name!r} needs the package {e.name!r}, which is not installed; run `make setup`"
        ) from e
    return getattr(module, attr)

"""Name -> environment factory: built-in adapters, installed plugin packages, and `module:Class` specs.

An environment is named in one of three ways, wherever simplan takes an env (`--env`, suites, recipes):

    twx                          a built-in adapter (`_BUILTIN` below)
    shop                         an entry point of an installed package, in the group `simplan.envs`:
                                     [project.entry-points."simplan.envs"]
                                     shop = "simplan_shop.env:ShopEnv"
                                 (examples/simplan-shop is a complete plugin package)
    mypkg.myenv:MyEnv            any importable class (or factory) that implements `envs.base.Env`

`simplan envs list` shows the built-ins and the installed plugins with their packages; a name that
matches none raises `UnknownEnvError`, whose message lists the known names and the `module:Class`
form. `register(name, factory)` still adds a name for the current process (tests, notebooks).

Every env `make_env` returns wears `envs.limits.LimitedEnv`: a wall-clock limit per step and a cap on
observation length, set with the `step_timeout` and `max_observation_chars` kwargs (envs/limits.py).
`env.unwrapped` is the adapter itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simplan.core.errors import MissingPackageError, UsageError
from simplan.envs.base import Env
from simplan.envs.limits import LimitedEnv, enforces_step_timeout, make_limited

ENTRY_POINT_GROUP = "simplan.envs"
# name -> "module:factory". Imported lazily so listing envs needs no JVM and no optional package.
_BUILTIN: dict[str, str] = {
    "twx": "simplan.envs.textworld_express:TextWorldExpressEnv",
    "scienceworld": "simplan.envs.scienceworld:ScienceWorldEnv",
    "bfcl": "simplan.envs.bfcl:BFCLEnv",
    "toy": "simplan.envs.toy:ToyEnv",
}
_REGISTERED: dict[str, Callable[..., Env]] = {}
_REQUIRED = ("tasks", "reset", "step", "expert_plan", "parse_action", "close")


class UnknownEnvError(UsageError, LookupError):
    """An env name or `module:Class` spec that names no environment; the message says what to do."""


@dataclass(frozen=True)
class EnvSource:
    """Where a named env comes from: `builtin`, `registered` (register() in this process) or a package."""

    name: str
    target: str  # "module:attr", or the factory's qualified name for register()ed ones
    origin: str  # "builtin", "registered", or "plugin: DIST VERSION"


def register(name: str, factory: Callable[..., Env]) -> None:
    """Name `factory` for this process (a plugin package uses an entry point instead, module docstring)."""
    _REGISTERED[name] = factory


def sources() -> list[EnvSource]:
    """Every named env: built-ins, installed plugins (entry points) and register()ed ones, sorted by name."""
    found = {name: EnvSource(name, target, "builtin") for name, target in _BUILTIN.items()}
    for ep in _entry_points():
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown package"
        found.setdefault(ep.name, EnvSource(ep.name, ep.value, f"plugin: {dist}"))  # a built-in name wins
    for name, factory in _REGISTERED.items():
        found[name] = EnvSource(name, f"{factory.__module__}:{factory.__qualname__}", "registered")
    return [found[n] for n in sorted(found)]


def names() -> list[str]:
    return [s.name for s in sources()]


def make_env(name: str, **kwargs: Any) -> LimitedEnv:
    """Build an environment by name or `module:Class` under step limits; other kwargs go to the adapter.

    `step_timeout` (seconds per step, 0 = none) and `max_observation_chars` (0 = no cap) are the limits'
    (envs/limits.py); an adapter that takes `step_timeout` itself (BFCL) receives it instead.
    Raises UnknownEnvError for a name or spec that does not resolve (the message says what to do).
    """
    factory = resolve(name)
    _check_arguments(factory, name, kwargs)
    env = make_limited(factory, kwargs)
    if not isinstance(env.unwrapped, Env):  # a factory function may return anything
        made = type(env.unwrapped).__name__
        if callable(getattr(env.unwrapped, "close", None)):
            env.close()
        raise UnknownEnvError(
            f"env {name!r} returned an object of type {made}, which does not implement envs.base.Env "
            f"(name, {', '.join(_REQUIRED)})"
        )
    return env


def _check_arguments(factory: Callable[..., Env], name: str, kwargs: dict[str, Any]) -> None:
    """Refuse a factory that cannot take `kwargs` (`json:loads` needs a positional argument) with an error that says
    so, instead of a TypeError from the call; a TypeError inside a factory that does take them is left as it is."""
    own = {k: v for k, v in kwargs.items() if k != "max_observation_chars"}  # the limits' own keys, not the adapter's
    if not enforces_step_timeout(factory):
        own.pop("step_timeout", None)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (some builtins): let the call decide
        return
    try:
        signature.bind(**own)
    except TypeError as e:
        given = ", ".join(own) or "no arguments"
        raise UnknownEnvError(
            f"env {name!r}: {_qualified(factory)} cannot be made with {given} ({e}); "
            "an env factory takes keyword arguments only (the env's kwargs setting), e.g. a class implementing "
            "envs.base.Env"
        ) from None


def _qualified(factory: Callable[..., Any]) -> str:
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(factory)


def resolve(name: str) -> Callable[..., Env]:
    """The factory (usually the adapter class) that `name` stands for; see the module docstring."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownEnvError(f"env: give an environment name; {_known()}")
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        return _load(_BUILTIN[name], name)
    if ":" in name:
        return _load(name, name)
    for ep in _entry_points():
        if ep.name == name:
            return _load(ep.value, f"{name} (entry point of {ep.dist.name if ep.dist else 'a package'})")
    raise UnknownEnvError(f"unknown environment {name!r}; {_known()}")


def _known() -> str:
    return (
        f"known: {', '.join(names())} (`simplan envs list`), or give an adapter class as package.module:Class, "
        f"or install a package that declares it in the {ENTRY_POINT_GROUP!r} entry-point group"
    )


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _load(target: str, label: str) -> Callable[..., Env]:
    """Import "module:attr" and check it builds an `Env`; each failure says what to do."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UnknownEnvError(f"env {label!r}: {target!r} is not package.module:Class (both parts are needed)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing.startswith("simplan.") or missing == "simplan":
            raise  # our own code is broken, not the set-up: show the real error
        if module_name == missing or module_name.startswith(missing + "."):
            raise UnknownEnvError(
                f"env {label!r}: no module {missing!r} can be imported; install the package that holds it "
                "(pip install -e PATH) or put its folder on PYTHONPATH"
            ) from None
        fix = "run `make setup`" if module_name.startswith("simplan.") else f"install it (pip install {missing})"
        raise MissingPackageError(
            f"environment {label!r} needs the package {missing!r}, which is not installed; {fix}"
        ) from e
    try:
        factory = getattr(module, attr)
    except AttributeError:
        public = sorted(
            n for n, v in vars(module).items() if inspect.isclass(v) and v.__module__ == module_name and n[:1] != "_"
        )
        raise UnknownEnvError(
            f"env {label!r}: module {module_name!r} ({module.__file__}) has no attribute {attr!r}; "
            f"its classes: {', '.join(public) or 'none'}"
        ) from None
    if inspect.isclass(factory):
        missing = [m for m in _REQUIRED if not callable(getattr(factory, m, None))]
        if missing:
            raise UnknownEnvError(
                f"env {label!r}: {module_name}.{attr} is not an environment: it lacks {', '.join(missing)}; "
                "implement the envs.base.Env protocol (envs/toy.py is the smallest example)"
            )
    elif not callable(factory):
        raise UnknownEnvError(f"env {label!r}: {module_name}.{attr} is a {type(factory).__name__}, not a class")
    return factory

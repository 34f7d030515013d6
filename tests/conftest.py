"""Shared test fixtures. Tests run on the CPU in seconds; slow ones carry the `slow` marker.

Servers started by tests (inference/serving/server.py `start_server`) run in their own process group, so a
killed pytest would leave them running: SIGTERM and SIGHUP are turned into KeyboardInterrupt (the
test's `with start_server(...)` then stops its server, as on Ctrl-C), and every server still
running when pytest finishes is stopped. `shop_on_path` puts the example plugin env
(examples/simplan-shop, `simplan_shop.env:ShopEnv`) on sys.path without installing it. Merged models
(engines merge by default on the CPU) go to a session tmp folder ($SIMPLAN_MERGE_CACHE), not the user's cache.
`bench_script(name)` imports a script of bench/ (not a package) as a module.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

# Tests must not oversubscribe the 2 cores (torch + JVM + vLLM workers spin threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

INTERRUPT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_previous_handlers: dict[signal.Signals, object] = {}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    for sig in INTERRUPT_SIGNALS:
        _previous_handlers[sig] = signal.signal(sig, _interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    serve = sys.modules.get("simplan.inference.serving.server")  # imported only if some test started a server
    if serve is not None:
        serve.stop_all_servers()
    for sig, handler in _previous_handlers.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session", autouse=True)
def merge_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Merged models (inference/engines/merged.py) go to a session tmp folder, not the user's cache: engines
    built from an EngineConfig merge by default on the CPU (merge_adapters auto). Set in os.environ, so the
    commands tests run in subprocesses inherit it; $SIMPLAN_CACHE stays, for the converted base models."""
    from simplan.inference.engines.merged import MERGE_CACHE_ENV

    folder = tmp_path_factory.mktemp("merge-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MERGE_CACHE_ENV, str(folder))
        yield folder


SHOP_PACKAGE = Path(__file__).resolve().parents[1] / "examples" / "simplan-shop"
SHOP_SPEC = "simplan_shop.env:ShopEnv"


@pytest.fixture
def shop_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The shop importable and named `shop`, as `pip install -e examples/simplan-shop` makes it (its entry
    point), whether or not this venv has it installed: trajectories record the env's own name, which build
    resolves for the env's transient failures."""
    from simplan.envs import registry
    from simplan.envs.failures import rules_of_env

    monkeypatch.syspath_prepend(str(SHOP_PACKAGE))
    ep = importlib.metadata.EntryPoint(name="shop", value=SHOP_SPEC, group=registry.ENTRY_POINT_GROUP)
    installed = [e for e in registry._entry_points() if e.name != "shop"]
    monkeypatch.setattr(registry, "_entry_points", lambda: [*installed, ep])
    rules_of_env.cache_clear()  # a test before this one may have cached "shop" as unknown
    yield
    rules_of_env.cache_clear()


BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench_script(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import bench/NAME.py as a module: bench/ goes on sys.path for the test."""

    def load(name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(BENCH))
        return importlib.import_module(name)

    return load

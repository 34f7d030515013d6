"""scripts/cli.py: the OpenMP wait policy is set before a subcommand (and torch) loads, unless the user set one."""

from __future__ import annotations

import os
from types import SimpleNamespace

from simplan.scripts import cli


def test_passive_wait_policy_unless_the_user_chose_one() -> None:
    environ: dict[str, str] = {}
    cli.set_openmp_defaults("train", environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    cli.set_openmp_defaults("eval", environ)
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}  # the user's own value wins
    environ = {}
    cli.set_openmp_defaults("serve", environ)
    assert environ == {}  # vLLM's server keeps the runtime's defaults


def test_main_sets_the_policy_before_importing_the_subcommand(monkeypatch) -> None:
    seen: dict[str, str | None] = {}

    def import_module(name: str) -> SimpleNamespace:
        seen[name] = os.environ.get("OMP_WAIT_POLICY")
        return SimpleNamespace(main=lambda argv: 0)

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(cli.importlib, "import_module", import_module)
    assert cli.main(["train", "--help"]) == 0
    assert seen == {"simplan.scripts.train": "PASSIVE"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert cli.main(["eval", "--help"]) == 0
    assert seen["simplan.scripts.eval"] == "ACTIVE"

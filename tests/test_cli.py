"""scripts/cli.py: the OpenMP wait policy is chosen before a subcommand (and torch) loads, unless the user set one."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from simplan.scripts import cli


def test_wait_policy_spins_briefly_on_free_cores_and_sleeps_beside_other_jobs() -> None:
    assert cli.openmp_settings("eval", idle=1.95, cores=2) == {"GOMP_SPINCOUNT": "10000"}
    assert cli.openmp_settings("train", idle=1.0, cores=2) == {"OMP_WAIT_POLICY": "PASSIVE"}  # one core is busy
    assert cli.openmp_settings("eval", idle=None, cores=2) == {"OMP_WAIT_POLICY": "PASSIVE"}  # no /proc/stat
    assert cli.openmp_settings("build", idle=2.0, cores=2) == {"OMP_WAIT_POLICY": "PASSIVE"}  # runs no model
    assert cli.openmp_settings("serve", idle=2.0, cores=2) == {}  # vLLM's server keeps the runtime's defaults


def test_idle_cores_leave_the_hypervisors_steal_time_out() -> None:
    """A core the VM ran idle 70 ticks while the host stole 30 is idle (1.0), not 0.7: steal is no job here, and
    a busy core is busy whatever was stolen; guest times (already in user) are not counted twice."""
    from simplan.core.cpu import idle_between

    #                  user nice system idle iowait irq softirq steal guest guest_nice
    before = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 100 0 0 500 0 0 0 10 0 0\ncpu1 200 0 0 400 0 0 0 0 5 0\n"
    after = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 100 0 0 570 0 0 0 40 0 0\ncpu1 290 0 10 400 0 0 0 30 95 0\n"
    assert idle_between(before, after, {"cpu0", "cpu1"}) == pytest.approx(1.0)
    assert idle_between(before, after, {"cpu0"}) == pytest.approx(1.0)
    assert idle_between(before, after, {"cpu1"}) == pytest.approx(0.0)
    assert cli.openmp_settings("eval", idle=idle_between(before, after, {"cpu0"}) * 2, cores=2) == cli.SPIN_SHORT


def test_the_users_wait_policy_wins() -> None:
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}):
        environ = dict(mine)
        assert cli.set_openmp_defaults("eval", environ) == {}
        assert environ == mine
    environ = {}
    chosen = cli.set_openmp_defaults("train", environ)
    assert environ == chosen and chosen in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "10000"})
    environ = {}
    cli.set_openmp_defaults("serve", environ)
    assert environ == {}


def test_main_sets_the_policy_before_importing_the_subcommand(monkeypatch) -> None:
    seen: dict[str, str | None] = {}

    def import_module(name: str) -> SimpleNamespace:
        seen[name] = os.environ.get("OMP_WAIT_POLICY") or os.environ.get("GOMP_SPINCOUNT")
        return SimpleNamespace(main=lambda argv: 0)

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setattr(cli, "openmp_settings", lambda command, idle, cores: {"OMP_WAIT_POLICY": "PASSIVE"})
    monkeypatch.setattr(cli.importlib, "import_module", import_module)
    assert cli.main(["train", "--help"]) == 0
    assert seen == {"simplan.scripts.train": "PASSIVE"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert cli.main(["eval", "--help"]) == 0
    assert seen["simplan.scripts.eval"] == "ACTIVE"

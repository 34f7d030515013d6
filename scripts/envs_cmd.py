"""`simplan envs list` and `simplan envs check NAME`: list the environments, or check an adapter.

    simplan envs list                                       # built-ins and installed plugins (with their package)
    simplan envs check twx                                  # all 8 games, 3 train tasks each
    simplan envs check scienceworld --sample 1              # all 30 task types (minutes)
    simplan envs check twx --families coin,twc --env-kwargs '{max_steps: 50}'
    simplan envs check mypkg.myenv:MyEnv                    # an adapter class not installed as a plugin

NAME is a built-in, an installed plugin's name, or package.module:Class (envs/registry.py).

`check` prints a table of named checks (envs/check.py) and exits 1 if any failed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from simplan.core.config import parse_config
from simplan.core.errors import UsageError
from simplan.envs.base import env_extra
from simplan.envs.check import check_env
from simplan.envs.registry import EnvSource, make_env, sources
from simplan.scripts.cli import command, usage_errors

USAGE = (
    "usage: simplan envs list | simplan envs check NAME|package.module:Class [--sample N] [--families a,b] "
    "[--env-kwargs YAML]"
)


@dataclass
class EnvCheckConfig:
    sample: int = field(default=3, metadata={"help": "train tasks per family on which the expert must win"})
    families: list[str] | None = field(default=None, metadata={"help": "only these families (default: all)"})
    env_kwargs: dict | None = field(default=None, metadata={"help": "constructor arguments of the env, as YAML"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        if self.sample < 1:
            raise ValueError(f"sample: must be >= 1, got {self.sample}")
        if self.env_kwargs is not None and not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs: expected a YAML mapping, got {self.env_kwargs!r}")


def _describe(name: str) -> tuple[str, str]:
    """(one-line description, families) without starting any backend (adapters start JVMs lazily)."""
    try:
        env = make_env(name)
    except Exception as e:  # a missing optional package or a broken plugin should not hide the other envs
        return f"(unavailable: {e})", ""
    try:
        adapter = env.unwrapped  # the adapter's own docs, not those of make_env's limits wrapper
        module_doc = sys.modules[type(adapter).__module__].__doc__ or ""
        lines = (env_extra(env, "description") or type(adapter).__doc__ or module_doc).strip().splitlines()
        doc = lines[0] if lines else type(adapter).__name__
        families: Any = env_extra(env, "families")
        fams = ", ".join(families) if isinstance(families, list | tuple) else ""
        return doc, fams
    finally:
        env.close()


def list_envs() -> int:
    found: list[EnvSource] = sources()
    width = max(len(s.name) for s in found)
    for src in found:
        doc, fams = _describe(src.name)
        print(f"{src.name:<{width}}  {doc}")
        if src.origin != "builtin":
            print(f"{'':<{width}}  from {src.origin} ({src.target})")
        if fams:
            print(f"{'':<{width}}  families: {fams}")
    print("\nOr name any adapter class as package.module:Class (e.g. --env mypkg.myenv:MyEnv).")
    return 0


def check(argv: list[str]) -> int:
    cfg, extra = parse_config(
        [EnvCheckConfig],
        argv,
        description="Check an environment adapter against the Env contract (envs/check.py).",
        prog="simplan envs check",
        extra=lambda p: p.add_argument("name", help="env name (simplan envs list) or package.module:Class"),
    )
    with usage_errors(ImportError):  # an env whose package is not installed
        env = make_env(extra.name, **(cfg.env_kwargs or {}))
    try:
        report = check_env(env, fold_sample=cfg.sample, families=cfg.families, progress=cfg.progress)
    finally:
        env.close()
    print(report.table())
    return 0 if report.ok else 1


@command("simplan envs")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "list":
        return list_envs()
    if argv[0] == "check":
        return check(argv[1:])
    raise UsageError(f"unknown subcommand {argv[0]!r}\n{USAGE}")


if __name__ == "__main__":
    sys.exit(main())

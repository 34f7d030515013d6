"""Parse one or more config dataclasses from a YAML recipe plus command-line overrides.

In the spirit of TRL's `TrlParser`: every dataclass field becomes a `--field` flag (help from
`field(metadata={"help": ...})`), `--config FILE.yaml` supplies defaults, and flags given on the
command line win. The YAML file is flat (one key per field, across all the dataclasses); an
unknown key is an error that names the file and the key. We do not use transformers'
HfArgumentParser because importing transformers costs seconds for commands that never touch a
model (`simplan validate`, `simplan envs list`).

    @dataclass
    class BuildConfig:
        role: str = field(default="decider", metadata={"help": "decider or simulator"})

    (cfg,) = parse_config([BuildConfig], argv, description="...")
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, is_optional) for a field annotation like `int | None`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else str), True
    return tp, False


def _str2bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def _add_field(parser: argparse.ArgumentParser, f: dataclasses.Field, hints: dict[str, Any]) -> None:
    tp, optional = _base_type(hints[f.name])
    help_ = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help strings
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_}
    origin = typing.get_origin(tp)
    if tp is bool:
        kwargs.update(type=_str2bool, nargs="?", const=True, metavar="BOOL")
    elif bool in typing.get_args(hints[f.name]):  # `bool | str` (e.g. auto|true|false): a bare flag still means true
        kwargs.update(type=str, nargs="?", const="true", metavar="VALUE")
    elif origin in (list, tuple):
        (inner,) = typing.get_args(tp)[:1] or (str,)
        kwargs.update(type=_list_parser(inner), metavar="A,B,...")
    elif origin is dict or tp is dict:
        kwargs.update(type=yaml.safe_load, metavar="YAML")
    elif tp in (int, float, str):
        kwargs.update(type=tp)
    else:
        kwargs.update(type=str)
    if optional:
        kwargs["type"] = _none_or(kwargs["type"])
    flags = dict.fromkeys([f"--{f.name.replace('_', '-')}", f"--{f.name}"])  # both spellings, once each
    parser.add_argument(*flags, **kwargs)


def comma_list(value: str | list[str]) -> list[str]:
    """A list setting given as one comma-separated string (a recipe's `policies: expert,random`, a Python caller's
    "a,b") as the list it names; a list is returned as it is. Empty items are dropped ("a,,b," -> ["a", "b"]) and
    items are not stripped, exactly as `--flag a,b` is read on the command line: one rule wherever a list is written.
    """
    if isinstance(value, str):
        return [item for item in value.split(",") if item]
    return value


def _list_parser(inner: Any):
    def parse(v: str) -> list:
        return [inner(x) for x in comma_list(v)]

    return parse


def _none_or(fn):
    def parse(v: str):
        return None if v.lower() in ("none", "null") else fn(v)

    return parse


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe is a flat mapping of key: value, got {type(data).__name__}")
    return data


def parse_config(
    classes: list[type],
    argv: list[str] | None = None,
    description: str = "",
    prog: str | None = None,
    extra: typing.Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[Any, ...]:
    """Instantiate each dataclass from `--config` YAML defaults overridden by flags.

    Returns one instance per class, plus the argparse Namespace of `extra` arguments last when
    `extra` is given.
    """
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--config", default=None, help="YAML recipe whose keys set defaults for the flags below")
    owner: dict[str, type] = {}
    for cls in classes:
        group = parser.add_argument_group(cls.__name__)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name in owner:
                raise TypeError(f"field {f.name!r} is defined by both {owner[f.name].__name__} and {cls.__name__}")
            owner[f.name] = cls
            _add_field(group, f, hints)
    if extra is not None:
        extra(parser)
    ns = parser.parse_args(argv)
    values: dict[str, Any] = {}
    if ns.config:
        for key, value in load_yaml(ns.config).items():
            name = key.replace("-", "_")
            if name not in owner:
                parser.error(f"{ns.config}: unknown key {key!r}; valid keys: {', '.join(sorted(owner))}")
            values[name] = value
    cli = vars(ns)
    values.update({k: v for k, v in cli.items() if k in owner})
    try:
        out = list(instantiate(classes, values, f" (from {ns.config})" if ns.config else ""))
    except ValueError as e:
        parser.error(str(e))
    if extra is not None:
        out.append(argparse.Namespace(**{k: v for k, v in cli.items() if k not in owner and k != "config"}))
    return tuple(out)


def instantiate(classes: list[type], values: dict[str, Any], where: str = "") -> tuple[Any, ...]:
    """One instance per class from the flat `values` (each class takes its own fields); a bad value is a
    ValueError naming the class, `where` it came from and the field (its `__post_init__` message)."""
    out = []
    for cls in classes:
        kwargs = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
        try:
            out.append(cls(**kwargs))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{cls.__name__}{where}: {e}") from None
    return tuple(out)


def load_configs(
    classes: list[type],
    recipe: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    overrides_from: str = "overrides",
) -> tuple[Any, ...]:
    """`parse_config` without a command line, for code that runs commands' stages as library calls.

    The recipe's keys give defaults and `overrides` (field names, values as a YAML recipe holds them)
    win, as flags do on the command line. An unknown key is a ValueError naming the recipe (or
    `overrides_from`, where the overrides were written) and the key; a bad value one naming the class
    and the field.
    """
    owner = {f.name for cls in classes for f in dataclasses.fields(cls) if f.init}
    values: dict[str, Any] = {}
    for source, mapping in ((str(recipe), load_yaml(recipe) if recipe else {}), (overrides_from, overrides or {})):
        for key, value in mapping.items():
            name = key.replace("-", "_")
            if name not in owner:
                raise ValueError(f"{source}: unknown key {key!r}; valid keys: {', '.join(sorted(owner))}")
            values[name] = value
    return instantiate(classes, values, f" (from {recipe})" if recipe else "")


def to_dict(*configs: Any) -> dict[str, Any]:
    """Resolved config(s) as one flat dict (written next to outputs for reproducibility)."""
    out: dict[str, Any] = {}
    for c in configs:
        out.update(dataclasses.asdict(c))
    return out

"""Config dataclasses from YAML recipes and command-line flags, with nested sections and dotted overrides.

In the spirit of TRL's `TrlParser` and torchtune's per-component configs: every dataclass field becomes a
flag (help from `field(metadata={"help": ...})`), `--config FILE.yaml` supplies defaults, and flags given on
the command line win. A field whose type is itself a dataclass is a *section*: its fields are flags
`--section.field` and a recipe writes it as a mapping (`judge: {w_error: -3}`) or with dotted keys
(`judge.w_error: -3`). A mapping-typed field (`planner: dict`) takes a YAML mapping, and single keys of it
with dotted flags (`--planner.judge.w_error -3`). An unknown key is an error that names the file and the key;
a bad value one that names the class and the field.

Every value is read by the field's type, whatever its source: `1e-4` in a recipe is a float (YAML reads it as
text), `true`/`false` a bool, `a,b` a list of two (the command line's comma rule), `none` None where the field
allows it. We do not use transformers' HfArgumentParser because importing transformers costs seconds for
commands that never touch a model (`simplan validate`, `simplan envs list`).

Renamed and moved fields: a config class may declare `LEGACY_KEYS = {"old_name": "section.new_name"}`; recipes,
mappings and flags that use an old name are read as the new one here, in one place (`upgrade_keys`), so old
recipes, run folders and traces keep working.

    @dataclass
    class BuildConfig:
        role: str = field(default="decider", metadata={"help": "decider or simulator"})

    (cfg,) = parse_config([BuildConfig], argv, description="...")
    (cfg,) = load_configs([BuildConfig], "recipe.yaml", {"role": "simulator"})     # the same without argv
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from simplan.core.errors import InputError, MissingInputError

T = TypeVar("T")
_NONE_WORDS = ("none", "null", "~")
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")


# ---------------------------------------------------------------------------------------------
# Field types
# ---------------------------------------------------------------------------------------------
def _base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, is_optional) for a field annotation like `int | None`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else tp), type(None) in typing.get_args(tp)
    return tp, False


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def section_type(hint: Any) -> type | None:
    """The dataclass of a section field (`judge: JudgeConfig`), None for any other field."""
    tp, _ = _base_type(hint)
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _is_mapping(hint: Any) -> bool:
    tp, _ = _base_type(hint)
    return tp is dict or typing.get_origin(tp) is dict


def comma_list(value: str | list[str]) -> list[str]:
    """A list setting given as one comma-separated string (a recipe's `policies: expert,random`, a Python caller's
    "a,b") as the list it names; a list is returned as it is. Empty items are dropped ("a,,b," -> ["a", "b"]) and
    items are not stripped, exactly as `--flag a,b` is read on the command line: one rule wherever a list is written.
    """
    if isinstance(value, str):
        return [item for item in value.split(",") if item]
    return value


def _str2bool(v: str) -> bool:
    if v.lower() in _TRUE_WORDS:
        return True
    if v.lower() in _FALSE_WORDS:
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def coerce(value: Any, hint: Any, name: str) -> Any:
    """`value` (from YAML, a flag or a Python caller) as the type `hint` declares; ValueError naming `name`."""
    tp, optional = _base_type(hint)
    if value is None or (optional and isinstance(value, str) and value.lower() in _NONE_WORDS):
        if optional or tp is Any:
            return None
        raise ValueError(f"{name}: a value is required, got none")
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            return value if isinstance(value, bool) else _str2bool(str(value))
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if math.isnan(out):
                raise ValueError
            return out
        if tp is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return value if isinstance(value, str) else str(value)
        if origin in (list, tuple):
            (inner,) = typing.get_args(tp)[:1] or (str,)
            items = comma_list(value) if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                raise ValueError
            return [coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(items)]
        if tp is dict or origin is dict:
            value = _yaml_mapping(value, name) if isinstance(value, str) else value
            if not isinstance(value, dict):
                raise ValueError
            return value
    except _NotYaml as e:
        raise ValueError(str(e)) from None
    except (ValueError, TypeError, yaml.YAMLError):
        raise ValueError(f"{name}: expected {_type_name(hint)}, got {value!r}") from None
    return value


class _NotYaml(ValueError):
    pass


def _yaml_mapping(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = f"{name}: not valid YAML ({yaml_problem(e)}) in {text!r}"
        raise _NotYaml(f"{problem}; write a mapping: '{{key: value}}'") from None


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong and where ("expected ',' or '}', but got '<stream end>' at line 1,
    column 12"), instead of PyYAML's multi-line message with a caret drawing."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _type_name(hint: Any) -> str:
    tp, optional = _base_type(hint)
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        text = "a comma-separated list or a YAML list"
    elif tp is dict or origin is dict:
        text = "a YAML mapping"
    elif tp in (int, float, str, bool):
        text = {int: "an integer", float: "a number", str: "text", bool: "true or false"}[tp]
    else:
        text = str(tp)
    return text + (" (or none)" if optional else "")


# ---------------------------------------------------------------------------------------------
# Keys: flatten a recipe into dotted keys, upgrade legacy names, build the nested dataclasses
# ---------------------------------------------------------------------------------------------
def legacy_keys(cls: type) -> dict[str, str]:
    return dict(getattr(cls, "LEGACY_KEYS", {}) or {})


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every settable key of `cls` as a dotted path, sections expanded (`judge.w_error`)."""
    out = []
    for f in _fields(cls):
        sub = section_type(_hints(cls)[f.name])
        out += dotted_keys(sub, f"{prefix}{f.name}.") if sub else [prefix + f.name]
    return out


def flatten(cls: type, mapping: dict[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """`mapping` (a recipe, overrides, flags) as {dotted key: value} of `cls`'s fields. Sections may be nested
    mappings or dotted keys; a mapping field's sub-keys stay dotted (`planner.judge.w_error`) until `build`.
    Legacy names are upgraded (LEGACY_KEYS). An unknown key is a ValueError naming `source` and the key."""
    if not isinstance(mapping, dict):
        section = f"{prefix.rstrip('.')}: " if prefix else ""  # a section given a list or a number names itself
        raise InputError(f"{source}: {section}expected a mapping of key: value, got {type(mapping).__name__}")
    hints, names, legacy = _hints(cls), {f.name for f in _fields(cls)}, legacy_keys(cls)
    out: dict[str, Any] = {}
    for raw_key, value in mapping.items():
        key = str(raw_key).replace("-", "_")
        head, _, rest = key.partition(".")
        if head not in names and key in legacy:
            out.update(flatten(cls, {legacy[key]: value}, source, prefix))
            continue
        if head not in names and head in legacy:
            out.update(flatten(cls, {legacy[head] + ("." + rest if rest else ""): value}, source, prefix))
            continue
        if head not in names:
            valid = ", ".join(sorted(dotted_keys(cls)))
            raise InputError(f"{source}: unknown key {prefix + key!r}; valid keys: {valid}")
        sub = section_type(hints[head])
        if sub is not None and not rest and isinstance(value, str):  # `--judge '{error: -3}'`
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as e:
                raise InputError(f"{source}: {prefix + key}: not valid YAML ({yaml_problem(e)})") from None
        if sub is not None and not rest and key in legacy and not isinstance(value, dict):
            out.update(flatten(cls, {legacy[key]: value}, source, prefix))  # an old scalar key a section replaced
            continue
        if sub is not None:
            inner = {rest: value} if rest else value
            if dataclasses.is_dataclass(inner) and not isinstance(inner, type):
                inner = dataclasses.asdict(inner)
            out.update(flatten(sub, inner, source, f"{prefix}{head}."))
        elif rest and not _is_mapping(hints[head]):
            raise InputError(f"{source}: {prefix + head!r} is not a section; {prefix + key!r} is no key")
        else:
            out[prefix + key] = value
    return out


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def merge(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Dotted values `new` over `base`: a whole mapping value replaces the dotted sub-keys given before it."""
    out = dict(base)
    for key, value in new.items():
        for old in [k for k in out if k.startswith(key + ".")]:
            del out[old]
        out[key] = value
    return out


def upgrade_keys(cls: type, mapping: dict[str, Any], source: str = "mapping") -> dict[str, Any]:
    """`mapping` with legacy keys read as today's, as the nested mapping a recipe would write (one place where old
    flat keys are upgraded: recipes, `--planner` mappings, run folders and traces written before a rename)."""
    return _nest(flatten(cls, mapping, source))


def build(cls: type[T], dotted: dict[str, Any], where: str = "") -> T:
    """An instance of `cls` from {dotted key: value} (flattened and upgraded); each value read by its field's
    type; a bad value is a ValueError naming the class, `where` it came from and the field."""
    kwargs: dict[str, Any] = {}
    hints = _hints(cls)
    for f in _fields(cls):
        sub = section_type(hints[f.name])
        if sub is not None:
            inner = {k[len(f.name) + 1 :]: v for k, v in dotted.items() if k.startswith(f.name + ".")}
            kwargs[f.name] = build(sub, inner, where)
            continue
        value: Any = dotted.get(f.name, dataclasses.MISSING)
        if _is_mapping(hints[f.name]):
            subkeys = {k[len(f.name) + 1 :]: v for k, v in dotted.items() if k.startswith(f.name + ".")}
            if subkeys:
                try:
                    base = _default(f) if value is dataclasses.MISSING else coerce(value, hints[f.name], f.name)
                except ValueError as e:
                    raise InputError(f"{cls.__name__}{where}: {e}") from None
                value = copy.deepcopy(base or {})
                for k, v in subkeys.items():
                    _set_path(value, k.split("."), v)
        if value is dataclasses.MISSING:
            continue
        try:
            kwargs[f.name] = coerce(value, hints[f.name], f.name)
        except ValueError as e:
            raise InputError(f"{cls.__name__}{where}: {e}") from None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise InputError(f"{cls.__name__}{where}: {e}") from None


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _set_path(node: dict[str, Any], path: list[str], value: Any) -> None:
    for p in path[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = node[p] = {}
        node = nxt
    node[path[-1]] = value


def from_mapping(cls: type[T], mapping: dict[str, Any] | None, source: str = "mapping") -> T:
    """An instance of `cls` from a (possibly nested, possibly legacy) mapping, as a recipe writes it."""
    where = f" (from {source})" if source != "mapping" else ""
    return build(cls, flatten(cls, mapping or {}, source), where)


# The folder that holds simplan's own recipes/ (a checkout, or an editable install of one)
SHIPPED_ROOT = Path(__file__).resolve().parents[1]


def recipe_path(path: str | Path) -> Path:
    """`path` as given when it exists; else, for a relative path, the shipped recipe of that name (`recipes/...`
    from simplan's own folder), so the default recipes are found from any working folder."""
    path = Path(path)
    shipped = SHIPPED_ROOT / path
    return shipped if not path.exists() and not path.is_absolute() and shipped.is_file() else path


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = recipe_path(path)
    if not path.is_file():
        raise MissingInputError(f"config file {path} does not exist" if not path.exists() else f"{path} is a folder")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig")) or {}
    except yaml.YAMLError as e:
        raise InputError(f"{path}: not valid YAML ({yaml_problem(e)}); fix the recipe") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the recipe as UTF-8") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a recipe is a mapping of key: value, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------------------------
# Several classes from one recipe: each top-level key belongs to one class
# ---------------------------------------------------------------------------------------------
def _owners(classes: list[type]) -> dict[str, type]:
    owner: dict[str, type] = {}
    for cls in classes:
        for name in [f.name for f in _fields(cls)] + list(legacy_keys(cls)):
            head = name.split(".")[0]
            if head in owner and owner[head] is not cls:
                raise TypeError(f"key {head!r} is defined by both {owner[head].__name__} and {cls.__name__}")
            owner[head] = cls
    return owner


def split_by_class(classes: list[type], mapping: dict[str, Any], source: str) -> dict[type, dict[str, Any]]:
    """{class: its dotted values} from one mapping whose top-level keys belong to different classes."""
    owner = _owners(classes)
    per: dict[type, dict[str, Any]] = {cls: {} for cls in classes}
    for key, value in mapping.items():
        head = str(key).replace("-", "_").split(".")[0]
        if head not in owner:
            valid = ", ".join(sorted({k for cls in classes for k in dotted_keys(cls)}))
            raise InputError(f"{source}: unknown key {key!r}; valid keys: {valid}")
        per[owner[head]] = merge(per[owner[head]], flatten(owner[head], {key: value}, source))
    return per


def load_configs(
    classes: list[type],
    recipe: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    overrides_from: str = "overrides",
) -> tuple[Any, ...]:
    """`parse_config` without a command line, for code that runs commands' stages as library calls.

    The recipe's keys give defaults and `overrides` (field names or dotted keys, values as a YAML recipe holds
    them) win, as flags do on the command line. An unknown key is a ValueError naming the recipe (or
    `overrides_from`, where the overrides were written) and the key; a bad value one naming the class and the
    field.
    """
    values = {cls: {} for cls in classes}
    for source, mapping in ((str(recipe), load_yaml(recipe) if recipe else {}), (overrides_from, overrides or {})):
        for cls, dotted in split_by_class(classes, mapping, source).items():
            values[cls] = merge(values[cls], dotted)
    where = f" (from {recipe})" if recipe else ""
    return tuple(build(cls, values[cls], where) for cls in classes)


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------
def _flag_type(hint: Any) -> Any:
    tp, _ = _base_type(hint)
    if tp is bool:
        return None  # nargs="?": a bare flag means true
    return str  # every value is read by `coerce`, as a recipe's is


def _add_fields(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    group = parser.add_argument_group(f"{cls.__name__}" if not prefix else f"{prefix.rstrip('.')} ({cls.__name__})")
    hints = _hints(cls)
    for f in _fields(cls):
        sub = section_type(hints[f.name])
        if sub is not None:
            group.add_argument(
                f"--{prefix}{f.name}",
                dest=prefix + f.name,
                default=argparse.SUPPRESS,
                metavar="YAML",
                help=f"the whole {f.name} section as a YAML mapping (its keys below)",
            )
            _add_fields(parser, sub, f"{prefix}{f.name}.")
            continue
        name = prefix + f.name
        help_ = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help strings
        default = _default(f)
        if default not in (None, "", [], {}):
            help_ += f" (default: {default})".replace("%", "%%")
        tp, _ = _base_type(hints[f.name])
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_}
        if tp is bool or bool in typing.get_args(hints[f.name]):
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        else:
            kwargs.update(metavar=_metavar(hints[f.name]))
        flags = dict.fromkeys([f"--{name.replace('_', '-')}", f"--{name}"])  # both spellings, once each
        group.add_argument(*flags, **kwargs)


def _metavar(hint: Any) -> str:
    tp, _ = _base_type(hint)
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return "A,B,..."
    if tp is dict or origin is dict:
        return "YAML"
    return {int: "INT", float: "NUMBER"}.get(tp, "VALUE")


def _add_legacy(parser: argparse.ArgumentParser, classes: list[type], known: set[str]) -> None:
    """Old flag names, hidden from --help, read as the keys they became."""
    for cls in classes:
        for old, new in legacy_keys(cls).items():
            for flag in dict.fromkeys([f"--{old}", f"--{old.replace('_', '-')}"]):
                if flag.lstrip("-") not in known:
                    parser.add_argument(
                        flag, dest=new, default=argparse.SUPPRESS, nargs="?", const="true", help=argparse.SUPPRESS
                    )


def _mapping_overrides(classes: list[type], rest: list[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    """`--planner.judge.w_error -3` style flags for mapping fields (argparse cannot know their keys)."""
    mapping_fields = {f.name for cls in classes for f in _fields(cls) if _is_mapping(_hints(cls)[f.name])}
    out: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        key, eq, inline = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        key = key.replace("-", "_")
        if not key or key.split(".")[0] not in mapping_fields or "." not in key:
            parser.error(f"unrecognized arguments: {' '.join(rest[i:])}")
        if eq:
            text = inline
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            i += 1
            text = rest[i]
        else:
            parser.error(f"argument --{key}: expected a value")
        try:
            out[key] = yaml.safe_load(text)
        except yaml.YAMLError as e:
            parser.error(f"argument --{key}: not valid YAML ({yaml_problem(e)})")
        i += 1
    return out


class ShortErrorParser(argparse.ArgumentParser):
    """argparse whose usage errors are two lines, the error and where the options are listed, not the usage of
    every flag (60 lines for `simplan eval`) above the one line that matters."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: `{self.prog} --help` lists every option\n")


def parse_config(
    classes: list[type],
    argv: list[str] | None = None,
    description: str = "",
    prog: str | None = None,
    extra: typing.Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[Any, ...]:
    """Instantiate each dataclass from `--config` YAML defaults overridden by flags.

    Returns one instance per class, plus the argparse Namespace of `extra` arguments last when `extra` is given.
    """
    parser = ShortErrorParser(prog=prog, description=description)
    parser.add_argument("--config", default=None, help="YAML recipe whose keys set defaults for the flags below")
    _owners(classes)  # refuses two classes that define one key
    for cls in classes:
        _add_fields(parser, cls)
    known = {k for cls in classes for k in dotted_keys(cls)} | {f.name for cls in classes for f in _fields(cls)}
    _add_legacy(parser, classes, known)
    extra_dests: set[str] = set()
    if extra is not None:
        before = {a.dest for a in parser._actions}
        extra(parser)
        extra_dests = {a.dest for a in parser._actions} - before
    ns, rest = parser.parse_known_args(argv)
    cli = {k: v for k, v in vars(ns).items() if k != "config" and k not in extra_dests}
    cli.update(_mapping_overrides(classes, rest, parser))
    values = {cls: {} for cls in classes}
    try:
        if ns.config:
            for cls, dotted in split_by_class(classes, load_yaml(ns.config), ns.config).items():
                values[cls] = dotted
        for cls, dotted in split_by_class(classes, cli, "the command line").items():
            values[cls] = merge(values[cls], dotted)
        where = f" (from {ns.config})" if ns.config else ""
        out: list[Any] = [build(cls, values[cls], where) for cls in classes]
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    if extra is not None:
        out.append(argparse.Namespace(**{k: getattr(ns, k) for k in extra_dests if hasattr(ns, k)}))
    return tuple(out)


def instantiate(classes: list[type], values: dict[str, Any], where: str = "") -> tuple[Any, ...]:
    """One instance per class from one mapping of their keys (each class takes its own)."""
    per = split_by_class(classes, values, where.strip(" ()") or "values")
    return tuple(build(cls, per[cls], where) for cls in classes)


def to_dict(*configs: Any) -> dict[str, Any]:
    """Resolved config(s) as one dict, sections nested (written next to outputs for reproducibility)."""
    out: dict[str, Any] = {}
    for c in configs:
        out.update(dataclasses.asdict(c))
    return out

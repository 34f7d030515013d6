"""Actions as text: how a model writes an action and how that text is read back, strictly.

    text = render_action(Action.tool_call("mv", {"src": "a", "dst": "b"}))   # "mv(src='a', dst='b')"
    action = parse_tool_call(text, allowed=["mv", "ls"])                   # the same Action, or ActionParseError
    pattern = call_regex(tools)                # the calls of `tools` whose arguments fit their schemas, as a regex

`render_action` is the one text form of an action: the decider's completion in training, what the planner
parses, what traces and prompts show. `parse_tool_call` reads model text with `ast` only: nothing is
evaluated, every value must be a plain JSON literal, and only the task's own tools are accepted.
"""

from __future__ import annotations

import ast
import functools
import json
import keyword
import math
import re
from collections.abc import Sequence
from typing import Any

from simplan.envs.base import Action, ActionParseError

FINISH_TEXT = "finish()"


# ---------------------------------------------------------------------------------------------
def render_action(action: Action) -> str:
    """The text a model reads and writes for an action (the decider's completion)."""
    if action.kind == "tool_call":
        args = ", ".join(f"{k}={v!r}" for k, v in action.arguments.items())
        return f"{action.name}({args})"
    if action.kind == "finish":
        return FINISH_TEXT
    return action.text.strip()


# Limits on a tool call's text and its argument values. Model text reaches ast.parse, so it is bounded
# before parsing (ast.parse recurses on nesting) and every value is checked to be plain JSON.
MAX_CALL_CHARS = 10_000  # the longest BFCL ground-truth call is 6,839 characters
MAX_LITERAL_DEPTH = 20  # nesting of lists and dicts in one argument (BFCL's deepest: a list of strings)
MAX_LITERAL_NODES = 5_000  # syntax-tree nodes of the whole call
MAX_INT = 2**63 - 1  # past this a JSON reader outside Python (int64, double) no longer reads the same number


def parse_tool_call(text: str, allowed: Sequence[str] | None = None) -> Action:
    """Parse `name(arg=literal, ...)` or `finish()` with `ast`; values must be JSON values written as
    Python literals: str, int (within +-MAX_INT), finite float, True/False/None, lists and dicts with
    string keys, nested at most MAX_LITERAL_DEPTH deep. A tuple is read as a list (JSON has only arrays,
    and `Action.key()` already made the two the same action); sets, bytes, complex numbers, `...`,
    names and expressions are refused.

    Nothing is evaluated: only the syntax tree is read, and only names in `allowed` are accepted.
    Every refusal is an ActionParseError with the reason, whatever the text (huge, deep, binary).
    """
    src = text.strip()
    if not src:
        raise ActionParseError("empty tool call")
    if len(src) > MAX_CALL_CHARS:
        raise ActionParseError(f"tool call of {len(src)} characters, longer than {MAX_CALL_CHARS}: {_clip(src)}")
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as e:
        raise ActionParseError(f"not a Python call expression: {_clip(src)} ({e.msg})") from None
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes; nesting too deep for the parser
        raise ActionParseError(f"not a Python call expression: {_clip(src)} ({type(e).__name__})") from None
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ActionParseError(f"expected name(arg=value, ...), got {_clip(src)}")
    if call.args:
        raise ActionParseError(f"{call.func.id}: use keyword arguments only")
    name = call.func.id
    if name == "finish":
        if call.keywords:
            raise ActionParseError("finish() takes no arguments")
        return Action(kind="finish")
    if allowed is not None and name not in allowed:
        raise ActionParseError(f"{name!r} is not one of this task's tools: {', '.join(allowed)}")
    nodes = sum(1 for _ in ast.walk(call))
    if nodes > MAX_LITERAL_NODES:
        raise ActionParseError(f"{name}: arguments of {nodes} syntax nodes, more than {MAX_LITERAL_NODES}")
    arguments: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionParseError(f"{name}: **kwargs are not allowed")
        if kw.arg in arguments:  # Python's parser lets it through (the compiler refuses it); one value per name
            raise ActionParseError(f"{name}: argument {kw.arg!r} given twice")
        try:
            arguments[kw.arg] = _json_literal(kw.value, depth=0)
        except ActionParseError as e:
            raise ActionParseError(f"{name}: argument {kw.arg!r} is not a literal value: {e}") from None
    return Action.tool_call(name, arguments)


def _json_literal(node: ast.expr, depth: int) -> Any:
    """The JSON value that `node` spells as a Python literal; ActionParseError saying why it is none."""
    if depth > MAX_LITERAL_DEPTH:
        raise ActionParseError(f"nested more than {MAX_LITERAL_DEPTH} deep")
    if isinstance(node, ast.Constant):
        return _json_constant(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = node.operand.value if isinstance(node.operand, ast.Constant) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ActionParseError("a sign applies to a number only")
        return _json_constant(-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_json_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise ActionParseError("dict keys must be strings")  # also `**` unpacking (k is None)
            out[_json_constant(k.value)] = _json_literal(v, depth + 1)
        return out
    kind = {ast.Set: "a set", ast.Name: "a name", ast.Call: "a call", ast.JoinedStr: "an f-string"}
    raise ActionParseError(f"{kind.get(type(node), 'an expression')}; use str, number, bool, None, list or dict")


def _json_constant(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # an escape such as '\udc80' in the text: no tool can receive it as UTF-8
            raise ActionParseError("a string with a lone surrogate (not valid Unicode)") from None
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ActionParseError(f"an integer beyond +-{MAX_INT}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ActionParseError(f"a float that is not finite ({value})")
        return value
    kind = "..." if value is Ellipsis else type(value).__name__  # bytes, complex, Ellipsis
    raise ActionParseError(f"a {kind} constant; use str, number, bool, None, list or dict")


def _clip(src: str, n: int = 80) -> str:
    """`src` quoted for an error message, cut to about n characters."""
    return repr(src) if len(src) <= n else f"{src[:n]!r}... ({len(src)} characters)"


# ---------------------------------------------------------------------------------------------
# A tool call checked against its tool's JSON schema (Observation.tools) before it reaches the env.
def tool_specs(tools: Sequence[Any] | None) -> list[dict[str, Any]]:
    """The tool descriptions in `tools`, each {name, description, parameters}: entries as they are, or OpenAI's
    {type: function, function: {...}} unwrapped; anything that is not a mapping is left out."""
    return [s for t in tools or [] if isinstance(t, dict) and isinstance(s := t.get("function", t), dict)]


def tool_parameters(tools: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The JSON schema of tool `name`'s arguments in `tools` (tool_specs), or None when the tool is not there or
    declares none."""
    for spec in tool_specs(tools):
        if spec.get("name") == name:
            parameters = spec.get("parameters")
            return parameters if isinstance(parameters, dict) and parameters else None
    return None


@functools.lru_cache(maxsize=512)
def _validator(schema_json: str) -> Any:
    """A jsonschema validator of one parameters schema (by its JSON text), or None when the schema itself is not a
    valid JSON schema (an env's own dialect): such a tool's calls go to the env unchecked rather than refused."""
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def argument_problem(action: Action, tools: Sequence[dict[str, Any]]) -> str | None:
    """Why `action`'s arguments do not fit its tool's schema in `tools` (the first problem jsonschema finds, with
    where it is), or None when they fit, when the action is no tool call, or when the tool declares no schema."""
    if action.kind != "tool_call" or not tools:
        return None
    schema = tool_parameters(tools, action.name)
    if schema is None:
        return None
    validator = _validator(json.dumps(schema, sort_keys=True))
    if validator is None:
        return None
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(action.arguments))
    if error is None:
        return None
    path = list(error.absolute_path)
    where = f"argument {path[0]}" + "".join(f"[{p!r}]" for p in path[1:]) + ": " if path else ""
    message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
    return f"{action.name}: {where}{message}"


# ---------------------------------------------------------------------------------------------
# The text of the calls that fit, as a regex: what the decider is decoded under (an engine's `regex` request).
_STRING = r"""(?:'(?:[^'\\\n\r]|\\.)*'|"(?:[^"\\\n\r]|\\.)*")"""  # either quote, any escape, one line
_INTEGER = r"-?(?:0|[1-9][0-9]*)"
_SCALARS = {
    "string": _STRING,
    "integer": _INTEGER,
    "number": _INTEGER + r"(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?",  # Python's repr of an int or a float
    "boolean": "(?:True|False)",
    "null": "None",
}
UNTYPED_DEPTH = 2  # lists and dicts nested in a value whose schema says nothing (BFCL's deepest: a list of strings)


def call_regex(tools: Sequence[dict[str, Any]], arguments: bool = True) -> str:
    """A regex of `finish()` and the calls of `tools` as render_action writes them, each argument's value a Python
    literal of its schema's type: `name(k=v, ...)` with the separators render_action uses, only declared argument
    names (when the tool declares properties), enums as their literals, arrays and objects as lists and dicts of
    their items. The decider's output is decoded under it, so a call of the wrong type or with an unknown argument
    cannot be written; what a regex cannot say without listing every order (required arguments, one of each) is
    left to the check before the call runs (argument_problem). A tool without a schema, or with one jsonschema
    does not read, takes any keyword arguments of plain literals. `arguments=False`: only the tool's name is
    constrained, `name(` anything `)`."""
    names = [str(spec["name"]) for spec in tool_specs(tools) if spec.get("name")]
    if not arguments:
        return rf"({'|'.join([re.escape(n) for n in names] + ['finish'])})\(.*\)"
    calls = [rf"{re.escape(n)}\({_arguments_regex(tool_parameters(tools, n))}\)" for n in dict.fromkeys(names)]
    return "(?:" + "|".join([*calls, r"finish\(\)"]) + ")"


def _arguments_regex(schema: dict[str, Any] | None) -> str:
    """The `k=v, ...` part of a call to a tool whose parameters are `schema`: at most as many arguments as it
    declares (a model that repeats one cannot run on until its token limit)."""
    properties = schema.get("properties") if schema is not None else None
    if schema is None or not isinstance(properties, dict) or _validator(json.dumps(schema, sort_keys=True)) is None:
        pair = rf"[A-Za-z_][A-Za-z0-9_]*={_untyped(UNTYPED_DEPTH)}"
        return f"(?:{pair}(?:, {pair})*)?"
    pairs = [f"{k}={_value_regex(v)}" for k, v in properties.items() if k.isidentifier() and not keyword.iskeyword(k)]
    if not pairs:
        return ""
    pair = _either(pairs)
    return f"(?:{pair}(?:, {pair}){{0,{len(pairs) - 1}}})?" if len(pairs) > 1 else f"(?:{pair})?"


def _value_regex(schema: Any) -> str:
    """A Python literal that fits `schema`; what it does not type is any plain literal."""
    if not isinstance(schema, dict):
        return _untyped(UNTYPED_DEPTH)
    if "const" in schema or isinstance(schema.get("enum"), list):
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return _either([re.escape(repr(v)) for v in values])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _either([_value_regex(s) for s in schema[key]])
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    parts = []
    for kind in kinds:
        if kind in _SCALARS:
            parts.append(_SCALARS[kind])
        elif kind == "array":
            parts.append(_list_regex(_value_regex(schema.get("items"))))
        elif kind == "object" and isinstance(schema.get("properties"), dict):
            pairs = [f"{re.escape(repr(k))}: {_value_regex(v)}" for k, v in schema["properties"].items()]
            parts.append(_dict_regex(_either(pairs)) if pairs else r"\{\}")
        elif kind == "object":
            parts.append(_dict_regex(f"{_STRING}: {_value_regex(schema.get('additionalProperties'))}"))
        else:
            return _untyped(UNTYPED_DEPTH)
    return _either(parts)


def _untyped(depth: int) -> str:
    """Any plain literal, lists and dicts nested at most `depth` deep."""
    scalars = _either([v for k, v in _SCALARS.items() if k != "integer"])  # a number's regex reads integers too
    if depth <= 0:
        return scalars
    inner = _untyped(depth - 1)
    return _either([scalars, _list_regex(inner), _dict_regex(f"{_STRING}: {inner}")])


def _list_regex(item: str) -> str:
    return rf"\[(?:{item}(?:, {item})*)?\]"


def _dict_regex(pair: str) -> str:
    return rf"\{{(?:{pair}(?:, {pair})*)?\}}"


def _either(alternatives: list[str]) -> str:
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"

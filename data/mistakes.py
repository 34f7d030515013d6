"""Mistakes and recoveries for collection: invalid commands and tool calls, wrong valid ones, their inverses.

    from simplan.data.mistakes import invalid_command, inverse_candidates, is_look_only, random_tool_call
    inverse_candidates(Action.command("go east"))          # ["go west"]
    is_look_only(Action.command("inventory"))              # True: it observes, it cannot change the world
    invalid_command(obs.valid_actions, rng)                # a plausible command the list does not hold

The noisy expert (data/policies.py) plays a mistake as an *invalid* action (`invalid_command`,
`invalid_tool_call`: a plausible command outside the valid actions, an unknown tool or a call missing its
arguments) or a *wrong valid* one (another valid action, or a read-only `random_tool_call`);
`is_look_only` names the mistakes that cannot change the state and `inverse_candidates` the commands that
may undo one (go east/go west, open/close, take/drop or put, turn on/off). The random policy builds its
tool calls with `random_tool_call`, argument values borrowed from the expert plan (`argument_pool`).
"""

from __future__ import annotations

import random
import re
from typing import Any

from simplan.envs.actions import tool_specs
from simplan.envs.base import Action

_OPPOSITE = {"north": "south", "east": "west", "up": "down", "northeast": "southwest", "northwest": "southeast"}
_OPPOSITE |= {v: k for k, v in _OPPOSITE.items()}
_TOGGLES = (("open", "close"), ("turn on", "turn off"), ("activate", "deactivate"), ("lock", "unlock"))
# Commands that only look: they cannot change the world (verified against the valid actions too).
_LOOK_ONLY = re.compile(r"^(look|look around|look at .+|l|inventory|inv|i|examine .+|x .+|score|task|help)$")
# Tool calls that only read state (BFCL-style names); an erroring call changes nothing either.
_READ_ONLY_TOOL = re.compile(
    r"^(ls|pwd|cat|grep|tail|head|wc|du|diff|find|stat|mean|get|list|check|display|view|show|search|describe|query)"
    r"(_|$)"
)
_ABSENT_NOUNS = ("unicorn", "golden key", "spaceship", "piano", "dragon", "teapot", "lantern", "treasure chest")
_DIRECTIONS = ("north", "south", "east", "west")


def norm_command(cmd: str) -> str:
    return " ".join(cmd.strip().lower().split())


def is_look_only(action: Action) -> bool:
    """True for commands/tool calls that observe without acting (look, inventory, ls, get_...)."""
    if action.kind == "command":
        return bool(_LOOK_ONLY.match(norm_command(action.text)))
    if action.kind == "tool_call":
        return bool(_READ_ONLY_TOOL.match(action.name.lower()))
    return False


def inverse_candidates(action: Action) -> list[str]:
    """Commands that would undo `action` (most specific first); empty when no inverse is known."""
    if action.kind != "command":
        return []
    cmd = norm_command(action.text)
    m = re.fullmatch(r"(go|move|walk|run)\s+(?:to\s+(?:the\s+)?)?(\w+)", cmd)
    if m and m.group(2) in _OPPOSITE:
        return [f"{m.group(1)} {_OPPOSITE[m.group(2)]}"]
    if cmd in _OPPOSITE:
        return [_OPPOSITE[cmd]]
    for a, b in _TOGGLES:
        for x, y in ((a, b), (b, a)):
            if cmd.startswith(x + " "):
                return [f"{y} {cmd[len(x) + 1 :]}"]
    m = re.fullmatch(r"(?:take|get|pick up)\s+(.+?)\s+from\s+(.+)", cmd)
    if m:
        obj, src = m.groups()
        return [f"put {obj} in {src}", f"put {obj} on {src}", f"put {obj} into {src}", f"move {obj} to {src}"]
    m = re.fullmatch(r"(?:take|get|pick up)\s+(.+)", cmd)
    if m:
        return [f"drop {m.group(1)}", f"put down {m.group(1)}"]
    m = re.fullmatch(r"(?:drop|put down)\s+(.+)", cmd)
    if m:
        return [f"take {m.group(1)}", f"pick up {m.group(1)}"]
    m = re.fullmatch(r"(?:put|place|move)\s+(.+?)\s+(?:in|on|into|onto|to)\s+(.+)", cmd)
    if m:
        obj, dst = m.groups()
        return [f"take {obj} from {dst}", f"take {obj}"]
    return []


def _verb_object(cmd: str) -> tuple[str, str]:
    words = cmd.split()
    if len(words) >= 3 and words[1] in ("on", "off", "up", "down", "at"):
        return " ".join(words[:2]), " ".join(words[2:])
    return words[0], " ".join(words[1:]).split(" from ")[0].split(" in ")[0].split(" on ")[0]


def invalid_command(valid: list[str] | None, rng: random.Random) -> str:
    """A plausible command that is not valid here: a blocked direction, a wrong verb-object pair, a missing thing."""
    valid_set = dict.fromkeys(norm_command(v) for v in valid or [])  # in the env's order: a set's is the hash seed's
    verbs, objects = ["take", "open", "examine", "eat"], list(_ABSENT_NOUNS)
    move = "go"
    for v in valid_set:
        verb, obj = _verb_object(v)
        if obj:  # verbs that take an object, recombined with other objects: "eat door", "open key"
            verbs.append(verb)
            objects.append(obj)
        if verb in ("go", "move", "walk") and obj in _OPPOSITE:
            move = verb
    candidates = [f"{move} {d}" for d in _DIRECTIONS]
    candidates += [f"{rng.choice(verbs)} {rng.choice(objects)}" for _ in range(8)]
    candidates += [f"{rng.choice(verbs)} {noun}" for noun in _ABSENT_NOUNS]
    candidates = [c for c in dict.fromkeys(candidates) if norm_command(c) not in valid_set]
    return rng.choice(candidates)


def argument_pool(plan: list[Action]) -> dict[str, list[Any]]:
    pool: dict[str, list[Any]] = {}
    for a in plan:
        for k, v in a.arguments.items():
            pool.setdefault(k, []).append(v)
    return pool


_DEFAULT_BY_TYPE: dict[str, Any] = {"string": "", "integer": 0, "number": 0.0, "float": 0.0, "boolean": False}


def random_tool_call(
    tools: list[dict[str, Any]], pool: dict[str, list[Any]], rng: random.Random, read_only: bool = False
) -> Action | None:
    """A call to one of the task's tools with its required arguments, values borrowed from `pool`."""
    specs = [t for t in tool_specs(tools) if t.get("name")]
    if read_only:
        specs = [t for t in specs if _READ_ONLY_TOOL.match(str(t["name"]).lower())]
    if not specs:
        return None
    spec = rng.choice(specs)
    params = spec.get("parameters") or {}
    props = params.get("properties") or {}
    args: dict[str, Any] = {}
    for name in params.get("required") or []:
        if pool.get(name):
            args[name] = rng.choice(pool[name])
        else:
            kind = (props.get(name) or {}).get("type", "string")
            args[name] = (
                [] if kind == "array" else {} if kind in ("dict", "object") else _DEFAULT_BY_TYPE.get(kind, "")
            )
    return Action.tool_call(str(spec["name"]), args)


def invalid_tool_call(tools: list[dict[str, Any]], rng: random.Random) -> Action:
    """An unknown tool, or a real tool called without its required arguments."""
    specs = [t for t in tool_specs(tools) if t.get("name")]
    needs_args = [t for t in specs if (t.get("parameters") or {}).get("required")]
    if needs_args and rng.random() < 0.5:
        return Action.tool_call(str(rng.choice(needs_args)["name"]), {})
    names = {str(t["name"]) for t in specs}
    base = rng.choice(sorted(names)) if names else "tool"
    name = next(n for n in (f"{base}_all", f"{base}_v2", f"{base}_now", "do_task") if n not in names)
    return Action.tool_call(name, {})

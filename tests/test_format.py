"""The prompt format: rendering, strict tool-call parsing, and the token budget."""

from __future__ import annotations

import pytest

from simplan.data import format as fmt
from simplan.envs import actions
from simplan.envs.actions import parse_tool_call, render_action
from simplan.envs.base import Action, ActionParseError


def _state(n_history: int = 5) -> fmt.PromptState:
    past = [(Action.command(f"go east {i}"), f"You are in room {i}.", i == 2) for i in range(n_history)]
    return fmt.state_from_steps(
        "Open the door.",
        "You see a door.",
        past,
        valid_actions=["open door", "look"],
        failures=["go west -> You can't do that."],
    )


def test_decider_and_simulator_messages_share_the_state_rendering():
    state = _state()
    dec = fmt.decider_messages(state)
    sim = fmt.simulator_messages(state, Action.command("open door"))
    assert [m["role"] for m in dec] == ["system", "user"]
    assert dec[0]["content"] == fmt.DECIDER_SYSTEM and sim[0]["content"] == fmt.SIMULATOR_SYSTEM
    # Same sections, simulator adds the action and its own question.
    assert sim[1]["content"].startswith(dec[1]["content"][: -len(fmt.ASK_DECIDER)])
    assert "Action: open door" in sim[1]["content"]
    assert "go east 2 [failed]" in dec[1]["content"]
    assert "go west -> You can't do that." in dec[1]["content"]
    assert "Valid actions: open door | look" in dec[1]["content"]


def test_tool_call_round_trip_and_refusals():
    action = Action.tool_call("mv", {"source": "a.txt", "destination": "b/", "n": [1, 2]})
    text = render_action(action)
    assert parse_tool_call(text, allowed=["mv"]) == action
    assert parse_tool_call("finish()").kind == "finish"
    for bad, reason in [
        ("__import__('os').system('ls')", "expected name"),
        ("mv(source=open('x').read())", "not a literal"),
        ("mv('a', 'b')", "keyword arguments"),
        ("cat(file='a')", "not one of this task's tools"),
        ("mv(source='a'", "not a Python call"),
        ("mv(**{'a': 1})", "kwargs"),
    ]:
        with pytest.raises(ActionParseError, match=reason):
            parse_tool_call(bad, allowed=["mv"])


def test_tool_call_values_must_be_json_and_bounded():
    action = parse_tool_call("f(a=(1, 2), b={'x': -1.5, 'y': [None, True]}, c=+3, d='\\x00é')")
    assert action.arguments == {"a": [1, 2], "b": {"x": -1.5, "y": [None, True]}, "c": 3, "d": "\x00é"}
    assert parse_tool_call(render_action(action)) == action  # a tuple is read as the list it renders as
    deep = actions.MAX_LITERAL_DEPTH + 2
    for bad, reason in [
        ("f(a={'a', 'b'})", "argument 'a' is not a literal value: a set"),
        ("f(a=b'..')", "a bytes constant"),
        ("f(a=1j)", "a complex constant"),
        ("f(a=...)", "a ... constant"),
        ("f(a=1e999)", "a float that is not finite"),
        ("f(a=-True)", "a sign applies to a number only"),
        ("f(a={1: 2})", "dict keys must be strings"),
        ("f(a={**{}})", "dict keys must be strings"),
        ("f(a=f'{x}')", "an f-string"),
        ("f(a=x)", "a name"),
        ("f(a=0x" + "f" * 20 + ")", "an integer beyond"),
        ("f(a='\\udc80')", "lone surrogate"),
        ("f(a=" + "[" * deep + "]" * deep + ")", f"nested more than {actions.MAX_LITERAL_DEPTH} deep"),
        ("f(a=" + "-" * 5000 + "1)", r"not a Python call expression: .*\(RecursionError\)"),
        ("f(a=" + "[" * 1000 + "]" * 1000 + ")", "not a Python call expression: .*too many nested"),
        ("f(a='\x00')", "not a Python call expression"),
        ("f(a='\udc80')", r"not a Python call expression: .*\(UnicodeEncodeError\)"),
        ("f(a='" + "x" * actions.MAX_CALL_CHARS + "')", f"longer than {actions.MAX_CALL_CHARS}"),
        ("f(a=[" + "[]," * 3000 + "])", f"more than {actions.MAX_LITERAL_NODES}"),
    ]:
        with pytest.raises(ActionParseError, match=reason):
            parse_tool_call(bad)
    assert parse_tool_call(f"f(a={2**63 - 1}, b={-(2**63 - 1)})").arguments == {"a": 2**63 - 1, "b": -(2**63 - 1)}


def test_action_key_is_unchanged_for_json_arguments_and_never_raises():
    action = Action.tool_call("mv", {"source": "é.txt", "n": [1, None, True], "opts": {"b": 1.5, "a": "x"}})
    assert action.key() == 'mv({"n": [1, null, true], "opts": {"a": "x", "b": 1.5}, "source": "é.txt"})'
    assert Action.tool_call("f", {"a": {1, 2}, "b": b"x"}).key() == 'f({"a": "{1, 2}", "b": "b\'x\'"})'
    assert Action.tool_call("f", {1: 2, "a": 3}).key() == "f(\"{1: 2, 'a': 3}\")"  # keys sort_keys cannot order
    assert Action.tool_call("f", {"a": 10**5000}).key() == 'f("<arguments too large to print>")'


def test_fit_to_budget_drops_oldest_history_first_and_keeps_goal_and_failures():
    state = _state(n_history=12)

    def count(messages):  # 1 token per word: deterministic and tokenizer-free
        return sum(len(m["content"].split()) for m in messages)

    full = count(fmt.decider_messages(state))
    fitted, dropped = fmt.fit_to_budget(state, fmt.decider_messages, count, budget=full - 10)
    assert dropped >= 1
    assert fitted.history == state.history[dropped:]  # the most recent steps are the ones kept
    assert count(fmt.decider_messages(fitted)) <= full - 10
    assert fitted.goal == state.goal and fitted.failures == state.failures
    same, none_dropped = fmt.fit_to_budget(state, fmt.decider_messages, count, budget=full)
    assert none_dropped == 0 and same is state


def test_failure_note_is_one_short_line():
    note = fmt.failure_note(Action.command("open door"), "The door\nis locked. " * 40, max_chars=50)
    assert "\n" not in note and note.startswith("open door -> The door is locked.") and len(note) < 70

"""The prompt format: rendering, strict tool-call parsing, and the token budget."""

from __future__ import annotations

import pytest

from simplan.data import format as fmt
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
    text = fmt.render_action(action)
    assert fmt.parse_tool_call(text, allowed=["mv"]) == action
    assert fmt.parse_tool_call("finish()").kind == "finish"
    for bad, reason in [
        ("__import__('os').system('ls')", "expected name"),
        ("mv(source=open('x').read())", "not a literal"),
        ("mv('a', 'b')", "keyword arguments"),
        ("cat(file='a')", "not one of this task's tools"),
        ("mv(source='a'", "not a Python call"),
        ("mv(**{'a': 1})", "kwargs"),
    ]:
        with pytest.raises(ActionParseError, match=reason):
            fmt.parse_tool_call(bad, allowed=["mv"])


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

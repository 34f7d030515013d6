"""`simplan import`: OpenAI and ShareGPT transcripts become trajectories that validate and build.

.venv/bin/pytest -q tests/test_import.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simplan.data.build import BuildConfig, build
from simplan.data.importers import ImportConfig, import_file
from simplan.data.trajectory import Trajectory
from simplan.data.validate import validate_file
from simplan.scripts.cli import main as simplan

DATA = Path(__file__).parent / "data"
OPENAI, SHAREGPT = DATA / "openai_chat.jsonl", DATA / "sharegpt.jsonl"


@pytest.fixture(scope="module")
def model_dir():
    from simplan.models.tiny import tiny_model

    return str(tiny_model("llama"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _import(tmp_path: Path, src: Path, fmt: str, **kw) -> tuple[list[dict], list[str], Path]:
    out = tmp_path / f"{src.stem}.out.jsonl"
    report = import_file(src, ImportConfig(format=fmt, out=str(out), **kw))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return records, report.problems, out


def test_openai_tool_calls_become_tool_call_steps_with_their_results(tmp_path):
    records, problems, out = _import(tmp_path, OPENAI, "openai")
    assert problems == [
        f"{OPENAI}:3: messages[1].tool_calls[0].arguments: not valid JSON (Expecting ',' delimiter at character 16)"
    ]
    assert len(records) == 3
    weather = records[0]
    assert weather["id"] == "imported/weather-1/imported/0" and weather["task"]["fold"] == "train"
    assert weather["goal"] == weather["initial_observation"] == "What is the weather in Paris, in Fahrenheit?"
    assert [t["name"] for t in weather["tools"]] == ["get_weather", "convert"]  # OpenAI's wrapper removed
    steps = weather["steps"]
    assert [(s["action"]["kind"], s["action"]["name"], s["action"]["arguments"]) for s in steps] == [
        ("tool_call", "get_weather", {"city": "Paris"}),
        ("tool_call", "convert", {"celsius": 18}),
        ("answer", "", {}),
        ("tool_call", "get_weather", {"city": "Rome"}),
        ("tool_call", "convert", {"celsius": 24}),
        ("answer", "", {}),
    ]
    # results are matched by tool_call_id even when they come back out of order
    assert steps[3]["next_observation"] == '{"celsius": 24, "sky": "sunny"}' and steps[4]["next_observation"] == "75.2"
    # the answer ends the user's turn: the next user message is its observation and the new goal
    assert steps[2]["next_observation"] == "And in Rome?" and steps[2]["info"] == {"goal": "And in Rome?"}
    assert all(s["observation"] == p["next_observation"] for p, s in zip(steps, steps[1:]))
    assert [s["done"] for s in steps] == [False] * 5 + [True] and weather["success"] and steps[-1]["won"]
    assert weather["meta"] == {
        "imported_from": f"{OPENAI}:1",
        "format": "openai",
        "system": ["You are a helpful assistant with tools."],
    }
    # a transcript without tools: assistant text is a command, the user's reply its observation
    game = records[1]
    assert game["tools"] is None and game["task"]["task_id"] == "openai_chat-2"
    assert [(s["action"]["kind"], s["action"]["text"], s["next_observation"]) for s in game["steps"]] == [
        ("command", "open fridge", "You open the fridge. Inside is an apple."),
        ("command", "take apple", "You take the apple."),
        ("command", "eat apple", "You eat the apple. You won!"),
    ]
    assert not game["success"]
    assert records[2]["steps"][0]["action"] == {"kind": "tool_call", "text": "", "name": "ls", "arguments": {}}
    assert validate_file(out).ok


def test_sharegpt_roles_and_function_calls(tmp_path):
    records, problems, out = _import(tmp_path, SHAREGPT, "sharegpt", env="mytools", fold="dev")
    assert len(problems) == 1 and problems[0].startswith(f"{SHAREGPT}:2: conversations[1].from: 'narrator' is not")
    lamp, flights, box = records
    assert lamp["id"] == "mytools/lamp/imported/0" and lamp["task"] == {
        "env": "mytools",
        "task_id": "lamp",
        "fold": "dev",
        "family": "",
        "params": {},
    }
    assert [s["action"]["text"] for s in lamp["steps"]] == ["take lamp", "turn on lamp"]
    assert lamp["meta"]["system"] == ["You play a text game."]
    assert flights["tools"][0]["name"] == "search_flights"  # the tools' JSON text was read
    assert [s["action"]["kind"] for s in flights["steps"]] == ["tool_call", "answer"]
    assert flights["steps"][0]["action"]["arguments"] == {"origin": "LIS", "destination": "BER"}
    assert flights["steps"][0]["next_observation"] == '[{"flight": "TP 542", "price": 129}]'
    assert box["meta"]["system"] == ["Solve it step by step."] and len(box["steps"]) == 2
    assert validate_file(out).ok


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"messages": [{"role": "assistant", "content": "hi"}]}', "messages[0]: a conversation opens with the user"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": '
            '[{"id": "a", "function": {"name": "f", "arguments": "{}"}}]}]}',
            "the last tool call 'f' has no tool result",
        ),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": '
            '[{"id": "a", "function": {"name": "f", "arguments": "[1]"}}]}, {"role": "tool", "content": "r"}]}',
            "messages[1].tool_calls[0].arguments: expected a JSON object of names",
        ),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": '
            '[{"id": "a", "function": {"name": "f"}}]}, {"role": "tool", "tool_call_id": "b", "content": "r"}]}',
            "messages[2].tool_call_id: 'b' answers none of the calls",
        ),
        ("not json", "not valid JSON"),
    ],
)
def test_a_bad_line_is_reported_with_file_line_and_the_rest_converts(tmp_path, line, reason):
    src = tmp_path / "chats.jsonl"
    good = '{"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "north"}]}'
    src.write_text(f"{good}\n{line}\n{good.replace('north', 'south')}\n")
    report = import_file(src, ImportConfig(format="openai"))
    assert len(report.problems) == 1 and report.problems[0].startswith(f"{src}:2: ")
    assert reason in report.problems[0]
    written = [Trajectory.from_dict(json.loads(line)) for line in Path(report.out).read_text().splitlines()]
    assert report.converted == 2 and [t.steps[0].action.text for t in written] == ["north", "south"]
    assert Path(report.out) == tmp_path / "chats.trajectories.jsonl" and validate_file(report.out).ok


def test_lines_that_break_the_reader_are_kept_aside_and_the_good_ones_still_written(tmp_path, capsys):
    """A line nested 10,000 deep, a tool call whose `arguments` string nests that deep, a 5,000-digit integer and a
    NaN `success` each used to raise out of the import (RecursionError, ValueError) and lose the whole file."""
    src = tmp_path / "chats.jsonl"
    good = '{"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "north"}]}'
    call = {"id": "a", "function": {"name": "f", "arguments": "[" * 10_000}}
    deep_arguments = json.dumps(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "content": "r"},
            ]
        }
    )
    bad = {
        2: ("[" * 10_000, "not readable (nested deeper than 100 levels)"),
        3: (deep_arguments, "messages[1].tool_calls[0].arguments: not readable (nested deeper than 100 levels)"),
        4: (good.replace('"go"', "9" * 5000), "not readable (an integer of more than 4300 digits)"),
        5: (good[:-1] + ', "success": NaN}', "success: expected true or false, got nan"),
    }
    lines = [good, *(line for line, _ in bad.values()), good.replace("north", "south")]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert simplan(["import", "--format", "openai", str(src), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    for lineno, (_, reason) in bad.items():
        assert f"{src}:{lineno}: {reason}" in err, err
    assert "Traceback" not in err and f"-> {tmp_path / 'out.rejects.jsonl'}" in err
    assert len(out.read_text().splitlines()) == 2 and validate_file(out).ok  # nothing good was lost
    assert (tmp_path / "out.rejects.jsonl").read_text().splitlines() == lines[1:5]  # the bad ones, as they were
    assert simplan(["import", "--format", "openai", str(tmp_path / "out.rejects.jsonl"), "--out", str(out)]) == 1
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n")
    assert simplan(["import", "--format", "openai", str(blank)]) == 2
    assert f"{blank}: empty (no line to read)" in capsys.readouterr().err


def test_an_observation_over_the_env_cap_is_cut_and_counted(tmp_path):
    from simplan.envs.limits import DEFAULT_MAX_OBSERVATION_CHARS

    src = tmp_path / "chats.jsonl"
    huge = "x" * (DEFAULT_MAX_OBSERVATION_CHARS * 3)
    src.write_text(
        json.dumps({"messages": [{"role": "user", "content": huge}, {"role": "assistant", "content": "ok"}]}) + "\n"
    )
    report = import_file(src, ImportConfig(format="openai"))
    assert report.capped_steps == 2  # the opening observation and the first step's
    traj = json.loads(Path(report.out).read_text())
    for text in (traj["steps"][0]["observation"], traj["goal"]):  # the opening request is the goal too
        assert len(text) < DEFAULT_MAX_OBSERVATION_CHARS + 200 and "more characters cut" in text


def test_the_command_exits_1_on_a_bad_line_and_0_when_all_convert(tmp_path, capsys):
    assert simplan(["import", "--format", "openai", str(OPENAI), "--out", str(tmp_path / "o.jsonl")]) == 1
    assert f"{OPENAI}:3:" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text(OPENAI.read_text().splitlines()[1] + "\n")
    assert simplan(["import", "--format", "openai", str(good), "--out", str(tmp_path / "g.jsonl")]) == 0
    assert simplan(["import", "--format", "openai", str(tmp_path / "missing.jsonl")]) == 2
    with pytest.raises(SystemExit):
        simplan(["import", "--format", "csv", str(good)])


@pytest.mark.parametrize("fmt", ["conversation", "step"])
@pytest.mark.parametrize("role", ["decider", "simulator"])
def test_imported_trajectories_build(tmp_path, tokenizer, model_dir, fmt, role):
    from datasets import load_from_disk

    a, _, out_a = _import(tmp_path, OPENAI, "openai")
    b, _, out_b = _import(tmp_path, SHAREGPT, "sharegpt", env="mytools")
    cfg = BuildConfig(
        inputs=[str(out_a), str(out_b)],
        out=str(tmp_path / "ds"),
        model=model_dir,
        role=role,
        format=fmt,
        progress=False,
        dedupe=False,
    )
    result = build(cfg, tokenizer=tokenizer)
    train = load_from_disk(result.paths["dataset"])["train"]
    assert set(train["trajectory_id"]) == {r["id"] for r in a + b}
    text = json.dumps(list(train["messages"]))
    assert "get_weather(city='Paris')" in text and "turn on lamp" in text  # actions rendered as the model writes them
    assert "64.4" in text  # a tool result

"""`simplan import` streams: each good conversation is written as it is converted, to a temporary file renamed over
--out at the end, and the output is byte for byte what the import wrote when it held every trajectory (issue 30).

    .venv/bin/pytest -q tests/test_import_streaming.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from simplan.data import importers
from simplan.data.importers import ImportConfig, import_file
from simplan.envs.limits import DEFAULT_MAX_OBSERVATION_CHARS

# sha256 of the output and the rejects of `mixed_lines()`, imported as `mixed.jsonl` from its own folder, written
# by the import before it streamed (commit 5ee17ec, which held every trajectory in a list and wrote them at the end),
# with goals capped like observations since 575e10f: the one difference from 5ee17ec's bytes is the goal of the
# conversation past the observation cap (mixed-8), cut as its observation is
BEFORE = {
    "out": "9d07617badd70dc04cddaa6cfd0cdb145bcb4b2cc9d23ed6701dcb53f4fde6b4",
    "rejects": "95139806730c0e4b5233c6d5ef57f5abecdfdf01f9f8a45617a80ec32f63757a",
}


def _chat(user: str, reply: str, **extra: object) -> str:
    return json.dumps(
        {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]} | extra
    )


def mixed_lines() -> list[str]:
    """Good and bad conversations interleaved: torn JSON, a duplicate id, nesting too deep, a NaN success, a tool
    conversation, text past the observation cap, non-ASCII text, and a blank line."""
    tool_call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "café"}'}}
    tools = [{"type": "function", "function": {"name": "search", "description": "find", "parameters": {}}}]
    tool_chat = {
        "id": "tools-1",
        "tools": tools,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "find a café"},
            {"role": "assistant", "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": "c1", "content": "Café Ünder, 2 km"},
            {"role": "assistant", "content": "Café Ünder is 2 km away."},
        ],
    }
    return [
        _chat("go north", "north", id="a", success=True),
        '{"messages": [{"role": "user", "content": "torn',
        _chat("go south", "south"),
        _chat("again", "east", id="a"),  # the id of line 1
        json.dumps(tool_chat, ensure_ascii=False),
        "[" * 5000,
        "",
        _chat("x" * (DEFAULT_MAX_OBSERVATION_CHARS + 10), "ok"),
        _chat("q", "r")[:-1] + ', "success": NaN}',
        _chat("日本語で", "はい", id="jp"),
    ]


@pytest.fixture
def mixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # relative paths: FILE:LINE in the records does not depend on tmp_path
    src = Path("mixed.jsonl")
    src.write_text("\n".join(mixed_lines()) + "\n", encoding="utf-8")
    return src


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_the_streamed_output_is_byte_identical_to_before(mixed: Path) -> None:
    report = import_file(mixed, ImportConfig(format="openai", out="out.jsonl"))
    assert report.converted == 5 and report.capped_steps == 2
    assert [p.split(": ")[0] for p in report.problems] == [f"{mixed}:{n}" for n in (2, 4, 6, 9)]
    assert "id: 'a' was used before, at mixed.jsonl:1" in report.problems[1]
    assert [json.loads(line)["task"]["task_id"] for line in Path("out.jsonl").read_text().splitlines()] == [
        "a",
        "mixed-3",
        "tools-1",
        "mixed-8",
        "jp",
    ]
    assert Path(report.rejects).read_text().splitlines() == [mixed_lines()[i - 1] for i in (2, 4, 6, 9)]
    capped = json.loads(Path("out.jsonl").read_text().splitlines()[3])
    assert capped["goal"] == capped["initial_observation"]
    assert len(capped["goal"]) < DEFAULT_MAX_OBSERVATION_CHARS + 100
    assert {"out": _sha("out.jsonl"), "rejects": _sha(report.rejects)} == BEFORE
    assert "converted 5 conversation(s) -> out.jsonl; 4 line(s) failed" in report.summary()


def test_nothing_is_replaced_until_the_end_and_a_failed_import_leaves_the_old_output(
    mixed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Path("out.jsonl").write_text("the old output\n")
    Path("out.rejects.jsonl").write_text("the old rejects\n")
    seen: list[str] = []
    convert = importers.to_trajectory

    def to_trajectory(record, cfg, task_id, source):  # noqa: ANN001, ANN202 - the wrapped function's own
        traj = convert(record, cfg, task_id, source)
        seen.append(Path("out.jsonl").read_text())  # --out, while the import runs
        if task_id == "mixed-8":
            raise RuntimeError("the disk controller caught fire")
        return traj

    monkeypatch.setattr(importers, "to_trajectory", to_trajectory)
    with pytest.raises(RuntimeError, match="caught fire"):
        import_file(mixed, ImportConfig(format="openai", out="out.jsonl"))
    assert set(seen) == {"the old output\n"}  # each line went to a temporary file, not over the old output
    assert Path("out.jsonl").read_text() == "the old output\n"
    assert Path("out.rejects.jsonl").read_text() == "the old rejects\n"
    assert sorted(p.name for p in Path().iterdir()) == ["mixed.jsonl", "out.jsonl", "out.rejects.jsonl"]


def test_memory_does_not_hold_the_converted_trajectories(mixed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trajectory is written and let go: at most one is alive at a time."""
    import weakref

    alive: list[weakref.ref] = []
    convert = importers.to_trajectory

    def to_trajectory(record, cfg, task_id, source):  # noqa: ANN001, ANN202
        traj = convert(record, cfg, task_id, source)
        alive.append(weakref.ref(traj))
        assert sum(ref() is not None for ref in alive) <= 2  # this one, and the previous one at most
        return traj

    monkeypatch.setattr(importers, "to_trajectory", to_trajectory)
    report = import_file(mixed, ImportConfig(format="openai", out="out.jsonl"))
    assert report.converted == 5 and not hasattr(report, "trajectories")


def test_a_line_that_is_not_utf8_or_too_long_is_reported_and_the_rest_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes that are not UTF-8 spoil only their own line (kept aside as they were on disk); a line over the size
    cap is skipped without being held, reported at its line, and the lines after it are still read."""
    from simplan.core import io

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(io.iter_jsonl_lines, "__defaults__", (4096,))  # the cap one record may have, made small
    good, latin1 = (
        _chat("go north", "north").encode(),
        _chat("cafe", "ok").replace("cafe", "caf\xe9").encode("latin-1"),
    )
    Path("bytes.jsonl").write_bytes(b"\n".join([good, latin1, _chat("y" * 5000, "long").encode(), good]) + b"\n")
    report = import_file(Path("bytes.jsonl"), ImportConfig(format="openai", out="out.jsonl"))
    assert report.converted == 2 and len(report.problems) == 2
    assert report.problems[0].startswith("bytes.jsonl:2: ") and "not UTF-8 at byte" in report.problems[0]
    assert report.problems[1].startswith("bytes.jsonl:3: ") and "over the 4,096" in report.problems[1]
    assert Path(report.rejects).read_bytes() == latin1 + b"\n"  # the too-long line was never held, so not kept
    assert len(Path("out.jsonl").read_text().splitlines()) == 2

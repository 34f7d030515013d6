"""Bring your own trajectories: chat transcripts converted into the trajectory schema (data/trajectory.py).

    simplan import --format openai chats.jsonl --out runs/data/my-train.jsonl --env my-tools --fold train
    simplan import --format sharegpt convs.jsonl

    from simplan.data.importers import ImportConfig, import_file
    report = import_file("chats.jsonl", ImportConfig(format="openai"))
    print(report.summary())  # converted N; each line that could not be converted as FILE:LINE: reason

Each input line is one conversation:

- `openai`: `{"messages": [...], "tools": [...]}` (or a bare list of messages) in OpenAI chat format:
  roles system / user / assistant / tool, assistant `tool_calls` with `function.name` and
  `function.arguments` (a JSON object, or its JSON text), `tool` results matched by `tool_call_id`
  (else in order). `tools` may be OpenAI's `{"type": "function", "function": {...}}` or plain
  `{"name", "description", "parameters"}` objects.
- `sharegpt`: `{"conversations": [{"from": ..., "value": ...}], "system": ..., "tools": ...}` with
  `from` in human/user, gpt/assistant, system, tool/observation/function_response, and function_call
  (its value a JSON object `{"name", "arguments"}`, as LLaMA-Factory writes tool calls).

Both are read into one neutral list of messages, then into a Trajectory:

- the goal is the user's opening request (the user messages before the first assistant message), or
  the line's own `goal` string; the request is also the initial observation (the first user turn);
- tool conversations (a tool call anywhere, or tools declared): every tool call is one `tool_call`
  step whose next observation is its tool result; an assistant text reply is an `answer` step (it ends
  the user's turn, as in BFCL) whose next observation is the next user message, which also becomes the
  goal from then on (`info.goal`); text an assistant writes beside its tool calls is not kept;
- text conversations: every assistant message is a `command` step and the user or tool messages that
  follow it, joined, are its next observation.

Steps are recorded as `source: "expert"` (the transcript is the demonstration to imitate), the
policy is "imported", and success is unknown unless the line says `"success": true` (the line's
`id`, if a string, becomes the task id; else FILE-stem-LINE). System messages are kept in
`meta.system`; nothing in a transcript is executed.

A line that cannot be converted (torn JSON, nesting deeper than core/io.py MAX_JSON_DEPTH in the line or in an
`arguments` string, an integer too long to read, a `success` that is not true or false, a schema problem) is
reported as FILE:LINE: reason and kept aside, byte for byte, in OUT's `.rejects.jsonl` sibling; the good
conversations are written all the same. Observations and action texts longer than an env's own cap
(envs/limits.py DEFAULT_MAX_OBSERVATION_CHARS) are cut with its note and counted. An empty input is an error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from simplan.core.errors import EmptyInputError, MissingInputError
from simplan.core.io import (
    JsonlLine,
    JsonProblem,
    atomic_open,
    has_lines,
    iter_jsonl_lines,
    json_line,
    parse_json,
)
from simplan.data.build_inputs import cap_trajectory
from simplan.data.trajectory import Step, Trajectory, validate_record
from simplan.envs.base import FOLDS, Action, Task
from simplan.envs.limits import DEFAULT_MAX_OBSERVATION_CHARS

FORMATS = ("openai", "sharegpt")
IMPORTED_POLICY = "imported"
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}


@dataclass
class ImportConfig:
    format: str = field(default="openai", metadata={"help": f"input format: {' or '.join(FORMATS)}"})
    out: str = field(
        default="", metadata={"help": "output trajectory JSONL (default: FILE with .trajectories.jsonl next to it)"}
    )
    env: str = field(
        default="imported", metadata={"help": "environment name written into each record (env and task.env)"}
    )
    fold: str = field(default="train", metadata={"help": f"fold of every imported task: {', '.join(FOLDS)}"})

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format: {self.format!r} is not one of {FORMATS}")
        if self.fold not in FOLDS:
            raise ValueError(f"fold: {self.fold!r} is not one of {FOLDS}")
        if not self.env.strip() or "/" in self.env:
            raise ValueError(f"env: {self.env!r} must be a non-empty name without '/' (it starts every episode id)")


class ConversionError(ValueError):
    """A conversation that cannot become a trajectory; the message says where in the line and why."""


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str | None = None


@dataclass
class Message:
    """One chat message, whichever format it came from."""

    role: str  # system | user | assistant | tool
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    call_id: str | None = None  # a tool result: the call it answers
    where: str = ""  # its place in the input line, e.g. "messages[3]"


@dataclass
class ImportReport:
    converted: int = 0  # conversations written to `out`
    problems: list[str] = field(default_factory=list)  # "FILE:LINE: reason"
    out: str = ""
    rejects: str = ""  # the bad lines, byte for byte (written only when there are some)
    capped_steps: int = 0  # steps whose observation or action text was cut to DEFAULT_MAX_OBSERVATION_CHARS

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = list(self.problems)
        where = f" -> {self.out}" if self.out else ""
        lines.append(f"converted {self.converted} conversation(s){where}; {len(self.problems)} line(s) failed")
        if self.rejects:
            lines.append(f"the failed lines, as they were -> {self.rejects}")
        if self.capped_steps:
            lines.append(
                f"{self.capped_steps} step(s) had a text over {DEFAULT_MAX_OBSERVATION_CHARS:,} characters, "
                "cut with a note"
            )
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Reading each format into Messages
# ---------------------------------------------------------------------------------------------
def _text(value: Any, where: str) -> str:
    """Message content: a string, null, or OpenAI's list of content parts (text parts joined)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ConversionError(f"{where}[{i}]: only text content parts can be imported")
            parts.append(part["text"])
        return "\n".join(parts)
    raise ConversionError(f"{where}: expected text, got {type(value).__name__}")


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """Tool-call arguments: a JSON object, or the JSON text of one (OpenAI sends text)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = _json(value, where)
    if not isinstance(value, dict):
        raise ConversionError(f"{where}: expected a JSON object of names to values, got {type(value).__name__}")
    return value


def _tool_call(name: Any, arguments: Any, call_id: Any, where: str) -> ToolCall:
    if not isinstance(name, str) or not name.strip():
        raise ConversionError(f"{where}.name: a tool call needs the tool's name")
    return ToolCall(name, _arguments(arguments, f"{where}.arguments"), call_id if isinstance(call_id, str) else None)


def openai_messages(record: Any) -> tuple[list[Message], Any]:
    """(messages, declared tools) of one OpenAI chat line."""
    if isinstance(record, list):
        record = {"messages": record}
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise ConversionError("messages: expected a list of chat messages (or the line to be that list)")
    out = []
    for i, m in enumerate(record["messages"]):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ConversionError(f"{where}: expected an object, got {type(m).__name__}")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise ConversionError(f"{where}.role: {role!r} is not system, user, assistant or tool")
        calls = []
        for j, c in enumerate(m.get("tool_calls") or []):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict):
                raise ConversionError(f"{where}.tool_calls[{j}]: expected {{'function': {{'name', 'arguments'}}}}")
            calls.append(_tool_call(fn.get("name"), fn.get("arguments"), c.get("id"), f"{where}.tool_calls[{j}]"))
        if role == "assistant" and isinstance(m.get("function_call"), dict):  # OpenAI's older single call
            fc = m["function_call"]
            calls.append(_tool_call(fc.get("name"), fc.get("arguments"), None, f"{where}.function_call"))
        role = {"developer": "system", "function": "tool"}.get(role, role)
        call_id = m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else None
        out.append(Message(role, _text(m.get("content"), f"{where}.content"), calls, call_id, where))
    return out, record.get("tools")


def sharegpt_messages(record: Any) -> tuple[list[Message], Any]:
    """(messages, declared tools) of one ShareGPT line."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        raise ConversionError("conversations: expected a list of {from, value} messages")
    out = []
    if isinstance(record.get("system"), str) and record["system"].strip():
        out.append(Message("system", record["system"], where="system"))
    for i, m in enumerate(record["conversations"]):
        where = f"conversations[{i}]"
        if not isinstance(m, dict):
            raise ConversionError(f"{where}: expected an object, got {type(m).__name__}")
        sender = m.get("from")
        if sender not in SHAREGPT_ROLES:
            raise ConversionError(f"{where}.from: {sender!r} is not one of {', '.join(SHAREGPT_ROLES)}")
        text = _text(m.get("value"), f"{where}.value")
        if sender == "function_call":
            call = _arguments(text, f"{where}.value")
            out.append(Message("assistant", "", [_tool_call(call.get("name"), call.get("arguments"), None, where)]))
        else:
            out.append(Message(SHAREGPT_ROLES[sender], text, where=where))
    tools = record.get("tools")
    if isinstance(tools, str):  # LLaMA-Factory and ToolACE keep the tool list as JSON text
        tools = _json(tools, "tools") if tools.strip() else None
    return out, tools


def _json(text: str, where: str) -> Any:
    """The JSON value an embedded string holds (tool arguments, a tool list), through the guard lines pass."""
    try:
        return parse_json(text, unit="character")
    except JsonProblem as e:
        raise ConversionError(f"{where}: {e}") from None


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Declared tools as `{name, description, parameters}` objects (OpenAI's `function` wrapper removed)."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise ConversionError(f"tools: expected a list of tool objects, got {type(value).__name__}")
    out = []
    for i, t in enumerate(value):
        if isinstance(t, dict) and isinstance(t.get("function"), dict):
            t = t["function"]
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ConversionError(f"tools[{i}]: expected an object with a name (or {{'function': {{'name': ...}}}})")
        out.append(t)
    return out


# ---------------------------------------------------------------------------------------------
# Messages -> Trajectory
# ---------------------------------------------------------------------------------------------
@dataclass
class _Pending:
    """A step whose action is known and whose next observation is still being read."""

    action: Action
    call_id: str | None = None
    results: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def messages_to_steps(messages: list[Message], tool_mode: bool) -> tuple[str, list[Step]]:
    """(first user message, steps) of a conversation; raises ConversionError naming the message at fault."""
    chat = [m for m in messages if m.role != "system"]
    first_action = next((i for i, m in enumerate(chat) if m.role == "assistant"), None)
    if first_action is None:
        raise ConversionError("no assistant message: no action to import")
    opening = chat[:first_action]
    if not opening or any(m.role != "user" for m in opening):
        where = next((m.where for m in opening if m.role != "user"), chat[0].where)
        raise ConversionError(f"{where}: a conversation opens with the user's request, before any other turn")
    first_user = "\n".join(m.text for m in opening)
    pending: list[_Pending] = []  # steps waiting for their next observation, in order
    done: list[_Pending] = []
    for m in chat[first_action:]:
        if m.role == "assistant":
            if tool_mode and m.tool_calls:
                unanswered = [p for p in pending if p.action.kind == "tool_call" and not p.results]
                if unanswered:
                    raise ConversionError(f"{m.where}: the tool call {unanswered[0].action.name!r} has no tool result")
                done += pending
                pending = [_Pending(Action.tool_call(c.name, c.arguments), c.call_id) for c in m.tool_calls]
            else:
                if not m.text.strip():
                    raise ConversionError(f"{m.where}: an assistant message with neither text nor tool calls")
                done += pending
                kind = "answer" if tool_mode else "command"
                pending = [_Pending(Action(kind=kind, text=m.text.strip()))]
        elif m.role == "tool":
            _attach_tool_result(pending, m)
        else:  # a user message
            target = pending[-1]  # after tool results without a reply, it continues the last call's observation
            target.results.append(m.text)
            if tool_mode:
                target.info["goal"] = m.text  # a new user turn: the request from here on (as BFCL records it)
    unanswered = [p for p in pending if p.action.kind == "tool_call" and not p.results]
    if unanswered:
        raise ConversionError(f"the last tool call {unanswered[0].action.name!r} has no tool result")
    done += pending
    return first_user, _steps(first_user, done)


def _attach_tool_result(pending: list[_Pending], m: Message) -> None:
    """A tool result goes to the call with its id, else to the first call still without one."""
    calls = [p for p in pending if p.action.kind == "tool_call"]
    if not calls:
        raise ConversionError(f"{m.where}: a tool result with no tool call before it")
    if m.call_id is not None and any(p.call_id is not None for p in calls):
        match = [p for p in calls if p.call_id == m.call_id]
        if not match:
            raise ConversionError(f"{m.where}.tool_call_id: {m.call_id!r} answers none of the calls before it")
        match[0].results.append(m.text)
        return
    waiting = [p for p in calls if not p.results]
    (waiting or calls)[0].results.append(m.text)


def _steps(first_observation: str, pending: list[_Pending]) -> list[Step]:
    steps, observation = [], first_observation
    for i, p in enumerate(pending):
        next_observation = "\n".join(p.results)
        last = i == len(pending) - 1
        steps.append(
            Step(
                index=i,
                observation=observation,
                action=p.action,
                next_observation=next_observation,
                done=last,
                source="expert",
                info=p.info,
            )
        )
        observation = next_observation
    return steps


def to_trajectory(record: Any, cfg: ImportConfig, task_id: str, source: str) -> Trajectory:
    """One input line (decoded JSON) as a Trajectory; raises ConversionError saying why not."""
    reader = openai_messages if cfg.format == "openai" else sharegpt_messages
    messages, declared = reader(record)
    tools = _tools(declared)
    tool_mode = tools is not None or any(m.tool_calls for m in messages)
    first_user, steps = messages_to_steps(messages, tool_mode)
    fields = record if isinstance(record, dict) else {}
    if isinstance(fields.get("id"), str) and fields["id"].strip():
        task_id = fields["id"].strip()
    goal = fields["goal"] if isinstance(fields.get("goal"), str) and fields["goal"].strip() else first_user
    success = fields.get("success", False)
    if not isinstance(success, bool):  # NaN, "yes", 1: unknown is not false
        raise ConversionError(f"success: expected true or false, got {success!r}; leave it out when unknown")
    system = [m.text for m in messages if m.role == "system" and m.text]
    meta: dict[str, Any] = {"imported_from": source, "format": cfg.format}
    if system:
        meta["system"] = system
    traj = Trajectory(
        id=f"{cfg.env}/{task_id}/{IMPORTED_POLICY}/0",
        env=cfg.env,
        task=Task(env=cfg.env, task_id=task_id, fold=cfg.fold),
        goal=goal,
        policy=IMPORTED_POLICY,
        initial_observation=first_user,
        steps=steps,
        tools=tools,
        success=success,
        final_score=1.0 if success else 0.0,
        meta=meta,
    )
    if success:
        traj.steps[-1].won = True
    problems = validate_record(traj.to_dict())
    if problems:
        raise ConversionError("; ".join(problems))
    return traj


def import_file(path: str | Path, cfg: ImportConfig) -> ImportReport:
    """Convert every line of `path`; write the converted ones to `cfg.out` (default next to the input).

    A line that cannot be converted is reported as FILE:LINE: reason and the others still convert. Each
    conversation is written as it is converted (memory holds one at a time, and the ids seen), to temporary
    files that replace `cfg.out` and its rejects file only when every line was read."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such file (give a JSONL file with one conversation per line)")
    if not has_lines(path):
        raise EmptyInputError(f"{path}: empty (no line to read); give a JSONL file with one conversation per line")
    report = ImportReport(out=cfg.out or str(default_out(path)))
    rejects = rejects_path(Path(report.out))
    seen: dict[str, int] = {}
    with contextlib.ExitStack() as files:
        out = files.enter_context(atomic_open(report.out))
        rejected: IO[bytes] | None = None  # opened at the first bad line: no rejects file when there is none
        for line in iter_jsonl_lines(path):
            where = f"{path}:{line.lineno}"
            try:
                traj = _convert_line(line, path, cfg, seen)
            except ConversionError as e:
                report.problems.append(f"{where}: {e}")
                if line.raw:  # a line over the size limit was never held, so it cannot be kept
                    if rejected is None:
                        rejected = files.enter_context(atomic_open(rejects, "wb"))
                    rejected.write(line.raw if line.raw.endswith(b"\n") else line.raw + b"\n")
                continue
            seen[traj.id] = line.lineno
            report.capped_steps += cap_trajectory(traj, DEFAULT_MAX_OBSERVATION_CHARS)
            out.write(json_line(traj.to_dict()))
            report.converted += 1
    if rejected is not None:
        report.rejects = str(rejects)
    elif rejects.exists():
        rejects.unlink()  # an earlier import's rejects: this one had none
    return report


def _convert_line(line: JsonlLine, path: Path, cfg: ImportConfig, seen: dict[str, int]) -> Trajectory:
    """One line of `path` as a Trajectory whose id is not in `seen` (id -> line number); ConversionError if not."""
    if line.text is None:
        raise ConversionError(line.problem or "not UTF-8")
    try:
        record = parse_json(line.text)
    except JsonProblem as e:
        raise ConversionError(str(e)) from None
    traj = to_trajectory(record, cfg, f"{path.stem}-{line.lineno}", f"{path}:{line.lineno}")
    if traj.id in seen:
        raise ConversionError(f"id: {traj.task.task_id!r} was used before, at {path}:{seen[traj.id]}")
    return traj


def default_out(path: Path) -> Path:
    return path.with_name(f"{path.stem}.trajectories.jsonl")


def rejects_path(out: Path) -> Path:
    """Where the lines that failed go: `X.jsonl` -> `X.rejects.jsonl` beside the output."""
    stem = out.name.removesuffix(".jsonl")
    return out.with_name(f"{stem}.rejects.jsonl")

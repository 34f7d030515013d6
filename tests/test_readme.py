"""The README's (and docs/'s) commands parse with today's CLI: every `simplan ...` line of their ```bash blocks.

.venv/bin/pytest -q tests/test_readme.py

Each line is split as a shell would (continuation lines joined, `# comments` dropped) and handed to
`simplan.scripts.cli.main`. The subcommand's own parser runs on it, config dataclasses included (their
`__post_init__` checks, recipes read with `--config`), and the test stops the command right after
parsing, before any model, env or file work. Lines with placeholders (`...`, `<NAME>`) are not allowed:
a README command must run as written, given the outputs of the stages before it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest

from simplan.scripts import cli
from simplan.scripts.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PLACEHOLDER = re.compile(r"\.\.\.|<[A-Za-z_ -]+>|\[[a-z-]+ [A-Z]+\]")


def readme_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every `simplan ...` line in ```bash blocks, continuation lines joined."""
    out: list[tuple[int, str]] = []
    in_bash, pending, start = False, "", 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        if not in_bash:
            continue
        if pending:
            pending += " " + line.strip()
        elif line.startswith("simplan "):
            pending, start = line.strip(), lineno
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
        else:
            out.append((start, pending))
            pending = ""
    return out


GUIDES = [README, *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = [
    (f"{path.relative_to(ROOT)}:{n}", line) for path in GUIDES for n, line in readme_commands(path.read_text())
]


class Parsed(Exception):
    """Raised in place of running the command once its arguments parsed."""


def _stop_after_parsing(module: object, monkeypatch: pytest.MonkeyPatch) -> None:
    if getattr(module, "parse_config", None) is parse_config:

        def parse_then_stop(*args, **kwargs):
            raise Parsed(parse_config(*args, **kwargs))

        monkeypatch.setattr(module, "parse_config", parse_then_stop)
    else:  # scripts with their own argparse parser (validate, report, models)
        real = argparse.ArgumentParser.parse_args

        def parse_args_then_stop(self, *args, **kwargs):
            raise Parsed(real(self, *args, **kwargs))

        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args_then_stop)
    if hasattr(module, "list_envs"):  # `envs list` takes no arguments: it is valid as soon as it dispatches
        monkeypatch.setattr(module, "list_envs", lambda: (_ for _ in ()).throw(Parsed()))


def _workdir(tmp_path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh folder with the repo's recipes and sample data, and the adapter folders the line names
    (as earlier stages would have written them: some configs check that an adapter folder exists)."""
    for name in ("recipes", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--adapters":
            for _, _, folder in (item.partition("=") for item in argv[i + 1].split(",")):
                if not folder:
                    continue
                adapter = tmp_path / folder
                adapter.mkdir(parents=True, exist_ok=True)
                (adapter / "adapter_config.json").write_text(json.dumps({"r": 16}))
    monkeypatch.chdir(tmp_path)


def test_the_readme_shows_every_stage():
    shown = {shlex.split(line)[1] for where, line in COMMANDS if where.startswith("README.md:")}
    stages = {"envs", "collect", "import", "validate", "build", "models", "train", "eval-model", "serve", "run"}
    assert stages | {"eval", "report", "pipeline"} <= shown


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_readme_command_parses(where, line, tmp_path, monkeypatch):
    assert not PLACEHOLDER.search(line), f"{where}: a placeholder in {line!r}; write a command that runs"
    argv = shlex.split(line, comments=True)
    assert argv[0] == "simplan" and argv[1] in cli.COMMANDS, f"{where}: {argv[1]!r} is no subcommand"
    _workdir(tmp_path, argv, monkeypatch)
    _stop_after_parsing(importlib.import_module(cli.COMMANDS[argv[1]][0]), monkeypatch)
    try:
        cli.main(argv[1:])
    except Parsed:
        return
    except SystemExit as e:
        pytest.fail(f"{where}: `{line}` does not parse (exit {e.code}); see the message above")
    pytest.fail(f"{where}: `{line}` returned without parsing its arguments")


@pytest.mark.parametrize(
    "line",
    [
        "simplan build --role decider --inputs a.jsonl --out x --no_such_flag 1",  # unknown flag
        "simplan import --format csv a.jsonl",  # a value __post_init__ refuses
        "simplan train --config recipes/no-such-recipe.yaml",  # a recipe that does not exist
        "simplan serve --port 70000",  # not a TCP port
        "simplan validate",  # a missing positional argument
    ],
)
def test_a_line_that_does_not_parse_fails(line, tmp_path, monkeypatch):
    """The check has teeth: what the CLI refuses raises before the command would run."""
    argv = shlex.split(line)
    _workdir(tmp_path, argv, monkeypatch)
    _stop_after_parsing(importlib.import_module(cli.COMMANDS[argv[1]][0]), monkeypatch)
    with pytest.raises((SystemExit, FileNotFoundError, ValueError)):
        cli.main(argv[1:])


def test_readme_commands_joins_continuations_and_skips_other_blocks():
    text = "```bash\nsimplan eval --a 1 \\\n    --b 2   # note\nmake demo\n```\n```\nsimplan report x\n```\n"
    assert readme_commands(text) == [(2, "simplan eval --a 1 --b 2   # note")]

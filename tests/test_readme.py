"""The README's (and docs/'s) commands run as written: every `simplan ...` line of their ```bash blocks.

    nice -n 19 .venv/bin/pytest -q tests/test_readme.py        # ~30 s: every command, made small

Every command runs once, in guide order (README.md, then docs/*.md), in one temporary folder, so that
`build` reads what `collect` wrote, `eval` loads what `train` saved and `report` reads what `eval`
wrote, as a reader runs them. They run in this process through `simplan.scripts.cli.main` (torch is
imported once). A rule in RULE_TABLE, keyed by the command line, makes each command small and keeps
what it does: the real model becomes a tiny random model (models/tiny.py), TextWorld-Express the toy
env, steps and episodes 1-2. A rule only swaps whole arguments and appends flags (the later flag wins),
so every flag the guide writes is still parsed: a renamed or removed flag fails here. The rule names
the files the guide promises; the test checks the exit status and that they exist.

Run with `--help` only (each flag the guide gives them must be in it), because they need a vLLM
server: `simplan serve` (it starts one) and `simplan eval --engine openai` (its client);
tests/test_engines.py runs that pair on a tiny model, marked slow. Not run at all: the README's `make
demo` (the hour-long real pipeline; the quick check is its small twin) and `make test` (it runs this
file). A command added to a guide without a rule fails with a message saying to add one. The README's
Python API block runs too (made small the same way, PYTHON_SWAPS), its sample trace line must have the
fields of a real `act` event, and every relative link in the guides must name a file that exists.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from simplan.scripts import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SHOP = ROOT / "examples" / "simplan-shop"  # the plugin package the guide installs with `pip install -e`
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


def canonical(line: str) -> str:
    """The command as a shell reads it (comment dropped, spacing normalised): the key of its rule."""
    return shlex.join(shlex.split(line, comments=True))


COMMANDS = [
    (f"{path.relative_to(ROOT)}:{n}", line) for path in GUIDES for n, line in readme_commands(path.read_text())
]

# ------------------------------------------------------------------------------------------ the rules
TINY = "{tiny}"  # stands for the tiny random model's folder, made when the commands run


@dataclass(frozen=True)
class Rule:
    """How one guide command runs here, and what it must leave behind."""

    swap: dict[str, str] = field(default_factory=dict)  # whole arguments replaced (model, env, suite, task)
    add: tuple[str, ...] = ()  # flags appended after the guide's own (the later flag wins): tiny limits
    outputs: tuple[str, ...] = ()  # files or folders (or glob patterns) the guide promises, in the work folder
    says: tuple[str, ...] = ()  # text the command must print
    exit: int = 0
    help_only: str = ""  # why only `--help` runs

    def argv(self, line: str, tiny: str) -> list[str]:
        words = shlex.split(line, comments=True)
        if self.help_only:
            return [*words[:2], "--help"]
        return [self.swap.get(w, w).replace(TINY, tiny) for w in words] + [a.replace(TINY, tiny) for a in self.add]


def flags(settings: dict[str, object]) -> tuple[str, ...]:
    """`--key value` for each setting; a mapping or list value as JSON (which YAML reads)."""
    return tuple(
        word
        for key, value in settings.items()
        for word in (f"--{key}", json.dumps(value) if isinstance(value, dict | list) else str(value))
    )


def under(folder: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{folder}/{name}" for name in names)


TO_TINY = {"smollm2-135m-instruct": TINY}
NO_ENV_KWARGS = {"{gold_path: false}": "{}"}
TO_TOY = {"twx": "toy", "twx-dev-small": "toy-dev", "cookingworld-dev-0": "corridor-100"}
TINY_TRAINING = {
    "max_steps": 1,
    "per_device_train_batch_size": 2,
    "max_length": 512,
    "eval_steps": 0,
    "max_eval_examples": 2,
    "save_steps": 100,
    "logging_steps": 1,
    "bf16": "false",
    "num_threads": 1,
}
TINY_ENGINE = {"dtype": "float32", "threads": 1}
TINY_PLANNER = {"decider_max_tokens": 8, "simulator_max_tokens": 8}
TINY_ARMS = {"plan": {"k": 2, "horizon": 1}, "simplan": {"k": 2, "horizon": 1}}
TINY_EVAL = {"episodes": 1, "max_steps": 2, "planner": TINY_PLANNER, "arm_overrides": TINY_ARMS}
# A pipeline section is a mapping, and a mapping flag replaces the recipe's whole mapping.
TINY_PIPELINE = {
    "collect_train": {"limit": 2, "policies": ["expert", "noisy_expert"], "attempts": 1, "branches": 0},
    "collect_dev": {"limit": 1, "policies": ["expert"], "branches": 0},
    "train": TINY_TRAINING,
    "eval": TINY_EVAL,
}
PIPELINE = "runs/pipeline/toy-tiny"
TWX_TRAIN = "runs/train/smollm2-135m-instruct/twx"
ADAPTERS = f"decider={TWX_TRAIN}/decider/adapter,simulator={TWX_TRAIN}/simulator/adapter"
NEEDS_SERVER = "needs a vLLM server (tests/test_engines.py serves a tiny model, marked slow)"

RULE_TABLE: dict[str, Rule] = {
    # --- README: quick check (docs/recipes.md repeats it)
    "simplan pipeline --config recipes/pipeline/toy-tiny.yaml --out runs/pipeline/toy-tiny": Rule(
        add=flags(TINY_PIPELINE),
        # README: data/ datasets/ train/ eval/ report/ and .stages/
        outputs=under(PIPELINE, "data/", "datasets/", "train/", "eval/", ".stages/", "report/report.html"),
    ),
    # --- README: each stage alone, on the toy env and the tiny model
    "simplan envs list": Rule(says=("toy ", "twx ")),
    "simplan envs check twx": Rule(swap=TO_TOY),
    "simplan collect --config recipes/collect/twx-train.yaml": Rule(
        add=flags({"env": "toy", "limit": 2, "workers": 1}), outputs=("runs/data/twx-train.jsonl",)
    ),
    "simplan collect --env twx --fold dev --limit 3 --policies expert,noisy_expert --branches 0 "
    "--out runs/data/twx-dev.jsonl": Rule(swap=TO_TOY, outputs=("runs/data/twx-dev.jsonl",)),
    "simplan validate runs/data/twx-train.jsonl runs/data/twx-dev.jsonl": Rule(),
    "simplan build --role decider --inputs runs/data/twx-train.jsonl,runs/data/twx-dev.jsonl "
    "--out runs/datasets/twx-decider": Rule(
        add=("--model", TINY),  # its tokenizer is SmolLM2's
        outputs=under("runs/datasets/twx-decider", "dataset/", "train.jsonl", "stats.md", "prompt_settings.json"),
    ),
    "simplan build --role simulator --inputs runs/data/twx-train.jsonl,runs/data/twx-dev.jsonl "
    "--out runs/datasets/twx-simulator": Rule(add=("--model", TINY), outputs=("runs/datasets/twx-simulator/dataset",)),
    # the toy env has no gold path to switch off: its counterfactuals run with no constructor arguments
    "simplan counterfactuals --inputs runs/data/twx-train.jsonl --out runs/data/twx-train-cf.jsonl "
    "--env_kwargs '{gold_path: false}'": Rule(swap=NO_ENV_KWARGS, outputs=("runs/data/twx-train-cf.jsonl",)),
    "simplan counterfactuals --inputs runs/data/twx-dev.jsonl --out runs/data/twx-dev-cf.jsonl "
    "--env_kwargs '{gold_path: false}'": Rule(swap=NO_ENV_KWARGS, outputs=("runs/data/twx-dev-cf.jsonl",)),
    "simplan build --role simulator --outcomes true --inputs runs/data/twx-train-cf.jsonl,runs/data/twx-dev-cf.jsonl "
    "--out runs/datasets/twx-simulator-outcomes": Rule(
        add=("--model", TINY),
        outputs=under("runs/datasets/twx-simulator-outcomes", "dataset/", "prompt_settings.json"),
    ),
    "simplan models fetch smollm2-135m-instruct": Rule(swap=TO_TINY, says=(TINY,)),
    "simplan train --config recipes/smollm2-135m-instruct/twx/decider.yaml": Rule(
        add=("--model", TINY, *flags(TINY_TRAINING)),
        outputs=under(  # README: adapter/ (peft + prompt_settings.json), checkpoint-N/, config.yaml, metrics.jsonl
            f"{TWX_TRAIN}/decider",
            *("adapter/adapter_config.json", "adapter/prompt_settings.json", "checkpoint-*/"),
            *("config.yaml", "metrics.jsonl"),
        ),
    ),
    "simplan train --config recipes/smollm2-135m-instruct/twx/simulator.yaml": Rule(
        add=("--model", TINY, *flags(TINY_TRAINING)), outputs=(f"{TWX_TRAIN}/simulator/adapter/adapter_config.json",)
    ),
    "simplan train --config recipes/smollm2-135m-instruct/twx/simulator-outcomes.yaml": Rule(
        add=("--model", TINY, *flags(TINY_TRAINING)),
        outputs=(f"{TWX_TRAIN}/simulator-outcomes/adapter/adapter_config.json",),
    ),
    "simplan fit-judge --inputs runs/data/twx-dev-cf.jsonl --out runs/judge --engine hf --model smollm2-135m-instruct "
    f"--adapters decider={TWX_TRAIN}/decider/adapter,simulator={TWX_TRAIN}/simulator-outcomes/adapter "
    "--write_adapter true": Rule(
        swap=TO_TINY,
        add=flags({"states": 4, **TINY_ENGINE}),
        outputs=(
            *under("runs/judge", "metrics.json", "metrics.md", "reliability.png"),
            f"{TWX_TRAIN}/simulator-outcomes/adapter/outcome_judge.json",
        ),
    ),
    "simplan eval-model --role decider --dataset runs/datasets/twx-decider "
    f"--adapter {TWX_TRAIN}/decider/adapter": Rule(
        add=flags({"model": TINY, "limit": 2, "max_new_tokens": 8, "num_threads": 1}),
        outputs=under(f"{TWX_TRAIN}/decider/eval-dev", "metrics.json", "metrics.md", "predictions.jsonl"),
    ),
    "simplan run --env twx --task cookingworld-dev-0 --arm simplan --engine hf --model smollm2-135m-instruct "
    f"--adapters {ADAPTERS}": Rule(
        swap=TO_TOY | TO_TINY,
        add=flags({"max_steps": 2, "k": 2, "horizon": 1, "view": "plain", **TINY_PLANNER, **TINY_ENGINE}),
        outputs=("runs/run/toy-corridor-100-simplan.jsonl",),
    ),
    "simplan eval --suite twx-dev-small --arms reactive,plan,simplan --engine hf --model smollm2-135m-instruct "
    f"--adapters {ADAPTERS} --out runs/eval/twx-dev-small": Rule(
        swap=TO_TOY | TO_TINY,
        add=flags({**TINY_EVAL, **TINY_ENGINE, "progress": "false"}),
        outputs=under("runs/eval/twx-dev-small", "traces.jsonl", "results.jsonl", "eval_config.json", "run.json"),
    ),
    "simplan report runs/eval/twx-dev-small --out runs/eval/twx-dev-small/report": Rule(
        outputs=under("runs/eval/twx-dev-small/report", "report.md", "report.html")
    ),
    # --- README: serving (docs/serving-and-engines.md serves with --port too)
    f"simplan serve --model smollm2-135m-instruct --adapters {ADAPTERS}": Rule(help_only=NEEDS_SERVER),
    f"simplan serve --model smollm2-135m-instruct --adapters {ADAPTERS} --port 8000": Rule(help_only=NEEDS_SERVER),
    "simplan eval --suite twx-dev-small --arms reactive,simplan --engine openai --model smollm2-135m-instruct "
    f"--adapters {ADAPTERS} --openai.base_url http://127.0.0.1:8000/v1 --out runs/eval/twx-dev-small-served": Rule(
        help_only=NEEDS_SERVER
    ),
    # --- docs/recipes.md: sections as dotted flags, a mapping field's keys as dotted flags
    "simplan run --env toy --arm reactive --engine random --budgets.max_steps 40 --judge.error -3 --view plain": Rule(
        add=("--budgets.max_steps", "3"), outputs=("runs/run/toy-corridor-100-reactive.jsonl",)
    ),
    "simplan eval --suite toy-dev --arms reactive --engine random --planner '{judge: {error: -3}}' "
    "--planner.budgets.max_steps 8 --out runs/eval/toy-random": Rule(
        add=flags({"progress": "false", "episodes": 1}), outputs=("runs/eval/toy-random/results.jsonl",)
    ),
    # --- README: your own env (docs/writing-an-environment.md repeats these), your own trajectories
    "simplan envs check simplan.envs.toy:ToyEnv --sample 2": Rule(),
    "simplan eval --suite toy-dev --arms reactive --engine expert --out runs/eval/toy-expert": Rule(
        add=flags({"progress": "false"}), outputs=("runs/eval/toy-expert/results.jsonl",)
    ),
    # Each sample file holds one bad line on purpose: exit 1, the other lines converted.
    "simplan import --format openai tests/data/openai_chat.jsonl --out runs/data/imported-openai.jsonl": Rule(
        exit=1, outputs=("runs/data/imported-openai.jsonl",)
    ),
    "simplan import --format sharegpt tests/data/sharegpt.jsonl --out runs/data/imported-sharegpt.jsonl "
    "--env mytools": Rule(exit=1, outputs=("runs/data/imported-sharegpt.jsonl",)),
    "simplan build --role decider --inputs runs/data/imported-openai.jsonl --out runs/datasets/imported-decider": Rule(
        add=("--model", TINY), outputs=("runs/datasets/imported-decider/dataset",)
    ),
    # --- docs/recipes.md
    "simplan train --config recipes/smollm2-135m-instruct/twx/decider.yaml --max_steps 100 "
    "--output_dir runs/train/decider-short": Rule(
        add=("--model", TINY, *flags(TINY_TRAINING)), outputs=("runs/train/decider-short/adapter/adapter_config.json",)
    ),
    # the demo's pipeline re-running two stages: here the toy-tiny one above, with its same settings
    "simplan pipeline --config recipes/pipeline/twx-smollm2.yaml --force eval,report": Rule(
        swap={"recipes/pipeline/twx-smollm2.yaml": "recipes/pipeline/toy-tiny.yaml"},
        add=flags(TINY_PIPELINE),
        says=("complete, reusing",),
        outputs=(f"{PIPELINE}/report/report.html",),
    ),
    # one flywheel round on the toy-tiny pipeline's adapters and data, made as small as that pipeline
    "simplan flywheel --config recipes/pipeline/flywheel-toy.yaml": Rule(
        add=flags({"train": TINY_TRAINING, "eval": TINY_EVAL, "engine": {**TINY_ENGINE, "engine": "hf"}}),
        says=("traces",),
        outputs=(
            "runs/flywheel/toy-tiny-1/report/report.html",
            "runs/flywheel/toy-tiny-1/train/decider/adapter/",
            "runs/flywheel/toy-tiny-1/simulator-check/summary.json",
        ),
    ),
    "simplan traces --runs runs/pipeline/toy-tiny/eval --out runs/data/toy-traces.jsonl": Rule(
        outputs=("runs/data/toy-traces.jsonl",)
    ),
    # --- docs/trajectory-schema.md
    "simplan validate runs/data/twx-train.jsonl": Rule(),
    # --- docs/writing-an-environment.md
    "simplan envs check toy": Rule(),
    # installed with `pip install -e examples/simplan-shop` in the guide; here named by its class, on sys.path
    "simplan envs check shop": Rule(swap={"shop": "simplan_shop.env:ShopEnv"}),
}
RULES = {canonical(line): rule for line, rule in RULE_TABLE.items()}


def rule_for(where: str, line: str) -> Rule:
    rule = RULES.get(canonical(line))
    assert rule is not None, (
        f"{where}: `{line}` has no rule; add one to RULE_TABLE in tests/test_readme.py (how to run it small, "
        "the files it must write)"
    )
    return rule


# ------------------------------------------------------------------------------------ running them
@dataclass
class Outcome:
    argv: list[str]
    exit: int | None  # None: it raised (the traceback is in `output`)
    output: str
    seconds: float

    def describe(self) -> str:
        return f"`{shlex.join(self.argv)}` exited {self.exit} after {self.seconds:.1f} s:\n{self.output[-4000:]}"


@dataclass
class Ran:
    work: Path
    tiny: str  # the tiny model's folder
    outcomes: dict[str, Outcome]  # by canonical guide line


def run_command(argv: list[str]) -> Outcome:
    """`argv` through the `simplan` entry point in this process, its output captured."""
    buffer, started = io.StringIO(), time.monotonic()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            code: int | None = cli.main(argv[1:])
        except SystemExit as e:  # argparse: 0 after --help, 2 for a bad flag
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except Exception:
            traceback.print_exc()
            code = None
    return Outcome(argv, code, buffer.getvalue(), time.monotonic() - started)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """Every guide command with a rule, in guide order, in one work folder (a command repeated runs once)."""
    from simplan.models.tiny import tiny_model

    tiny = str(tiny_model("llama"))
    work = tmp_path_factory.mktemp("readme")
    for name in ("recipes", "tests"):  # the guides name recipes/... and tests/data/... from the repo root
        (work / name).symlink_to(ROOT / name)
    outcomes: dict[str, Outcome] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.syspath_prepend(str(SHOP))
        # cli.main sets OMP_WAIT_POLICY where unset; set here, it is restored for the tests that follow
        mp.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        for _, line in COMMANDS:
            key = canonical(line)
            if key in RULES and key not in outcomes:
                outcomes[key] = run_command(RULES[key].argv(line, tiny))
    return Ran(work, tiny, outcomes)


# ------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_guide_command_runs(where: str, line: str, ran: Ran) -> None:
    assert not PLACEHOLDER.search(line), f"{where}: a placeholder in {line!r}; write a command that runs"
    rule = rule_for(where, line)
    outcome = ran.outcomes[canonical(line)]
    assert outcome.exit == rule.exit, f"{where}: expected exit {rule.exit}; {outcome.describe()}"
    if rule.help_only:
        given = [w.split("=")[0] for w in shlex.split(line, comments=True) if w.startswith("--")]
        missing = [flag for flag in given if flag not in outcome.output.split()]
        assert not missing, f"{where}: {missing} are not in `simplan {shlex.split(line)[1]} --help`"
        return
    missing = [pattern for pattern in rule.outputs if not any(ran.work.glob(pattern))]
    assert not missing, f"{where}: the guide promises {missing}, which were not written; {outcome.describe()}"
    unsaid = [text for text in (t.replace(TINY, ran.tiny) for t in rule.says) if text not in outcome.output]
    assert not unsaid, f"{where}: {unsaid} not in the output; {outcome.describe()}"


# The README's Python API block, made small the same way: its text -> what runs here.
PYTHON_SWAPS = {
    'make_env("twx")': 'make_env("toy")',
    '"smollm2-135m-instruct", adapters)': 'TINY, adapters, dtype="float32", threads=1)',
    'out="runs/datasets/toy-decider")': 'out="runs/datasets/toy-decider", model=TINY)',  # the tokenizer
    'PlannerConfig(arm="simplan")': 'PlannerConfig.from_dict({"arm": "simplan", "k": 2, "horizon": 1, '
    '"budgets": {"max_steps": 2}, "sampling": {"decider_max_tokens": 8}})',
}


def test_readme_python_api_runs(ran: Ran, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """After the commands above (its adapters are the ones `simplan train` wrote), in their folder."""
    (block,) = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    for old, new in PYTHON_SWAPS.items():
        assert old in block, f"README's Python API no longer says {old!r}; update PYTHON_SWAPS in tests/test_readme.py"
        block = block.replace(old, new.replace("TINY", repr(ran.tiny)))
    monkeypatch.chdir(ran.work)
    exec(compile(block, "README.md (Python API)", "exec"), {})  # the README's own example code, not model output
    assert (ran.work / "runs/datasets/toy-decider/dataset").is_dir()
    success, steps, pivots = capsys.readouterr().out.split()[-3:]
    assert success in ("True", "False") and steps == "2" and pivots.isdigit()


def test_readme_act_event_has_the_fields_of_a_real_one(ran: Ran) -> None:
    """The README's sample trace line lists what an `act` event of today's `simplan run` trace holds."""
    block = re.search(r"^```json\n(.*?)^```", README.read_text(), re.S | re.M)
    assert block, "README.md: the sample act event (a ```json block) is gone"
    shown = json.loads(block.group(1))
    trace = (ran.work / "runs/run/toy-corridor-100-simplan.jsonl").read_text().splitlines()
    real = next(event for event in map(json.loads, trace) if event["type"] == "act")
    assert list(shown) == list(real), f"README.md's act event: update it to the fields {list(real)}"


def test_every_rule_is_used() -> None:
    """A rule whose command left the guides is dead weight (and hides a renamed command)."""
    used = {canonical(line) for _, line in COMMANDS}
    assert not set(RULES) - used, f"rules for commands no guide shows: {sorted(set(RULES) - used)}"


def test_a_command_without_a_rule_fails_with_what_to_do() -> None:
    with pytest.raises(AssertionError, match=r"README.md:1: .* has no rule; add one to RULE_TABLE"):
        rule_for("README.md:1", "simplan train --config recipes/new.yaml")


def test_the_readme_shows_every_stage() -> None:
    shown = {shlex.split(line)[1] for where, line in COMMANDS if where.startswith("README.md:")}
    stages = {"envs", "collect", "import", "validate", "build", "models", "train", "eval-model", "serve", "run"}
    assert stages | {"eval", "report", "pipeline"} <= shown


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
def test_a_command_that_does_not_run_fails(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: what the CLI refuses ends with a non-zero exit (or an exception) before any work."""
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    monkeypatch.chdir(tmp_path)
    assert run_command(shlex.split(line)).exit != 0


def test_readme_commands_joins_continuations_and_skips_other_blocks() -> None:
    text = "```bash\nsimplan eval --a 1 \\\n    --b 2   # note\nmake demo\n```\n```\nsimplan report x\n```\n"
    assert readme_commands(text) == [(2, "simplan eval --a 1 --b 2   # note")]
    assert canonical("simplan eval --a 1 --b 2   # note") == "simplan eval --a 1 --b 2"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("guide", GUIDES, ids=[str(g.relative_to(ROOT)) for g in GUIDES])
def test_internal_links_point_to_files(guide: Path) -> None:
    broken = []
    for lineno, text in enumerate(guide.read_text().splitlines(), start=1):
        for target in LINK.findall(text):
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):  # an anchor on this page, or http:, mailto:
                continue
            if not (guide.parent / path).exists():
                broken.append(f"{guide.relative_to(ROOT)}:{lineno}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"

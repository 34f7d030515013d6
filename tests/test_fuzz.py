"""Fuzzing the model-text boundary: adversarial decider and simulator outputs never crash the planner.

A seeded corpus of model outputs (empty, huge, invalid Unicode, non-JSON literals, deep nesting,
Python code that would create a file if it ever ran, wrong tools and arguments, huge numbers, and
random mutations of real calls) is fed through the planner by a scripted engine on the toy env and
on BFCL. No exception may escape, no episode may end "errored" because of model text, every trace
must be written and read back, and the file the code would create must never appear. Engines that
break the protocol end their episode "errored" with an EngineContractError, and the evaluation goes on.

Run: .venv/bin/pytest -q tests/test_fuzz.py   (add `-m slow` for the 20,000-output run)
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from simplan.core.io import append_jsonl, write_jsonl
from simplan.envs.actions import parse_tool_call, render_action
from simplan.envs.base import ActionParseError, Env, Task
from simplan.envs.registry import make_env
from simplan.envs.toy import ToyEnv
from simplan.evaluation.runner import EvalConfig, evaluate
from simplan.inference.engines.base import (
    Completion,
    EngineContractError,
    GenerationRequest,
    GenerationResult,
    MeteredEngine,
    ScoreRequest,
    ScoreResult,
    sanitize_text,
)
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.config import SamplingConfig
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.router import BudgetConfig
from simplan.inference.planning.trace import append_trace, read_traces

# ast.parse warns about model text such as 'a\\d' or '1_a' (invalid escapes, literals): the text's problem.
pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::SyntaxWarning"),
]
SEED = 18
# Tool names of BFCL's file system and math APIs (the backends of most tasks) and names no task has.
TOOLS = ["cd", "ls", "cat", "touch", "echo", "mkdir", "mv", "rm", "grep", "tail", "add", "multiply", "mean", "power"]
NOT_TOOLS = ["nosuchtool", "__import__", "eval", "exec", "open", "os", "finish", "Finish", "cd.__class__"]
# Argument values that are fine as JSON. Random ones stay small: a huge number the parser accepts can make
# a tool run until the env's step timeout (10 s); the hand-picked huge ones below are refused fast.
JSON_VALUES = ["'a.txt'", "'..'", "''", "0", "-3", "2.5", "True", "None", "[1, 2]", "{'k': 'v'}", "'\\n'", "'é'"]
NON_JSON_VALUES = ["{'a', 'b'}", "b'..'", "1j", "...", "set()", "(1, b'x')", "{1: 2}", "{(1, 2): 3}", "float('nan')"]
HUGE_NUMBERS = ["9" * 5000, "0x" + "f" * 3000, "1e999", "-1e999", "9223372036854775808", "1e308", "-1e308", "1_0" * 40]
ALPHABET = "abc()[]{}'\",=:.-+_ 0123456789\n\t\\\x00\udc80\ud83d\u200b\ufffdé😀"


def code_texts(pwned: Path) -> list[str]:
    """Python that would create `pwned` if anything ever evaluated model text."""
    p = str(pwned)
    return [
        f"__import__('os').system('touch {p}')",
        f"cd(folder=__import__('os').system('touch {p}'))",
        f"exec(\"open('{p}', 'w')\")",
        f"eval(\"__import__('os').system('touch {p}')\")",
        f"open('{p}', 'w').write('x')",
        f"cd(folder=open('{p}', 'w'))",
        f"import os; os.system('touch {p}')",
        f"(lambda: __import__('os').system('touch {p}'))()",
        f"cd(**{{'folder': __import__('os').system('touch {p}')}})",
        f"cd(folder=f\"{{__import__('os').system('touch {p}')}}\")",
        f"[__import__('os').system('touch {p}') for _ in '1']",
        f"getattr(__builtins__, 'exec')(\"open('{p}', 'w')\")",
        f"cd(folder='x'); __import__('os').system('touch {p}')",
        f"cd(folder='x')\n__import__('pathlib').Path('{p}').touch()",
        f"cd(folder=().__class__.__base__.__subclasses__()[0]('{p}'))",
        f"touch(file_name='{p}')",  # a real BFCL tool: it touches bfcl's in-memory file system only
        f"echo(content='x', file_name='{p}')",
        f"go east; rm -rf / && touch {p}",
        f"$(touch {p})",
        f"`touch {p}`",
    ]


def fixed_texts(pwned: Path) -> list[str]:
    """Hand-picked outputs, one of every kind the random generator draws from."""
    d = 3000
    empty = ["", " ", "\n\n", "\x00"]
    unicode = ["\udc80", "\ud83d", "go east\udcff", "cd(folder='\udc80')", "cd(folder='\\udc80')"]
    unicode += ["\ufeffcd(folder='x')", "cd(folder='a\x00b')", "cd(folder='a\\x00b')", "\x1b[31mopen door\x1b[0m"]
    unicode += ["😀" * 3000]
    huge = ["x" * 200_000, "cd(folder='" + "a" * 50_000 + "')", "cd(folder='x')" * 500]
    deep = ["(" * 100_000, "[" * d + "]" * d, "cd(folder=" + "[" * 50 + "]" * 50 + ")", "cd(folder=" + "-" * d + "1)"]
    deep += ["cd(folder=" + "not " * d + "1)", "cd(folder=" + "(" * 150 + "1" + ")" * 150 + ")"]
    deep += ["cd(folder=" + "{'a': " * 30 + "1" + "}" * 30 + ")"]
    not_json = ["cd(folder={'a','b'})", "cd(folder=b'..')", "cd(folder=1j)", "cd(folder=...)", "mean(numbers={1, 2})"]
    not_json += ["cd(folder=(1, 2))"]
    wrong = ["nosuchtool(a=1)", "cd()", "cd(folder=1, extra=2)", "cd('pos')", "finish(now=True)", "finish()"]
    wrong += ["ls(a=True)", "power(base='x', exponent=None)", "mean(numbers=[])", "divide(a=1, b=0)"]
    wrong += ["go east", "GO   EAST", "take key\nopen door"]
    numbers = ["power(base=10, exponent=1e308)", "power(base=1e308, exponent=1e308)", "power(base=-8, exponent=0.5)"]
    numbers += ["add(a=" + "9" * 5000 + ", b=1)", "add(a=0x" + "f" * 3000 + ", b=1)", "add(a=1e999, b=1)"]
    numbers += ["mean(numbers=[1e308, 1e308])", "add(a=9223372036854775808, b=1)"]
    numbers += ["multiply(a=9223372036854775807, b=9223372036854775807)", "power(base=10, exponent=999999999)"]
    numbers += ["power(base=3, exponent=9223372036854775807)", "square_root(number=2, precision=999999999)"]
    return empty + unicode + huge + deep + not_json + wrong + numbers + code_texts(pwned)


def _value(rng: random.Random, depth: int = 0) -> str:
    """A random argument value as text: JSON, non-JSON, huge, or nested (sometimes too deep)."""
    roll = rng.random()
    if roll < 0.45 or depth > 25:
        return rng.choice(JSON_VALUES)
    if roll < 0.6:
        return rng.choice(NON_JSON_VALUES)
    if roll < 0.7:
        return rng.choice(HUGE_NUMBERS)
    if roll < 0.85:
        return "[" + ", ".join(_value(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    return "{" + ", ".join(f"'k{i}': {_value(rng, depth + 1)}" for i in range(rng.randint(0, 3))) + "}"


def _call(rng: random.Random) -> str:
    name = rng.choice(TOOLS + NOT_TOOLS)
    args = [f"{rng.choice(['folder', 'a', 'b', 'numbers', 'file_name', 'x', 'class'])}={_value(rng)}"]
    args += [_value(rng)] if rng.random() < 0.1 else []  # a positional argument
    return f"{name}({', '.join(args[: rng.randint(0, 2)])})"


def _mutate(rng: random.Random, text: str) -> str:
    """Up to three single-character edits, or a cut: what a sampler's slips look like."""
    if rng.random() < 0.2:
        return text[: rng.randint(0, len(text))]
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        i = rng.randint(0, len(chars))
        op = rng.random()
        if op < 0.5:
            chars.insert(i, rng.choice(ALPHABET))
        elif chars and op < 0.8:
            del chars[min(i, len(chars) - 1)]
        elif chars:
            chars[min(i, len(chars) - 1)] = rng.choice(ALPHABET)
    return "".join(chars)


def _random_text(rng: random.Random, pwned: Path) -> str:
    roll = rng.random()
    if roll < 0.35:
        return _call(rng)
    if roll < 0.7:
        return _mutate(rng, rng.choice([_call(rng), *code_texts(pwned), "go east", "take key", "finish()"]))
    if roll < 0.8:  # random bytes read back with surrogateescape: lone surrogates
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))).decode("utf-8", "surrogateescape")
    if roll < 0.9:
        d = rng.randint(10, 4000)
        return rng.choice(["cd(folder=" + "[" * d + "]" * d + ")", "-" * d + "1", "cd(a=" + "+" * d + "1)"])
    return rng.choice(ALPHABET) * rng.randint(0, 20_000)


def fuzz_corpus(n: int, pwned: Path, seed: int = SEED) -> list[str]:
    """The hand-picked outputs, then seeded random ones up to `n` in all."""
    rng = random.Random(seed)
    texts = fixed_texts(pwned)
    return texts + [_random_text(rng, pwned) for _ in range(n - len(texts))]


class Feed:
    """Serves the corpus in order (cycling) to every decider and simulator request, counting what it served."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.served = 0
        self._it = itertools.cycle(texts)

    def respond(self, req: GenerationRequest, prompt: str) -> list[str]:
        self.served += req.n
        return [next(self._it) for _ in range(req.n)]


@dataclass
class FuzzReport:
    outputs: int = 0  # model outputs the engine served
    episodes: int = 0
    errored: list[str] = field(default_factory=list)  # "episode: error" of episodes that ended errored
    crashed: list[str] = field(default_factory=list)  # exceptions that escaped Planner.run or the writers
    parse_failures: int = 0
    acts: int = 0


def fuzz_planner(env: Env, tasks: list[Task], texts: list[str], out: Path, max_steps: int, k: int = 2) -> FuzzReport:
    """Episodes of all three arms (K=`k` candidates for plan and simplan) over `tasks` until every text was
    served once; traces go to `out`."""
    feed = Feed(texts)
    # constrained=False: the backend refuses choices/regex, so every fuzzed text reaches the parser as is.
    engine = ScriptedEngine(feed.respond, feed.respond, lambda req, _: [0.0] * len(req.candidates), constrained=False)
    report = FuzzReport()
    for i in itertools.count():
        if feed.served >= len(texts):
            break
        arm = ("reactive", "plan", "simplan")[i % 3]
        cfg = PlannerConfig(
            arm=arm,
            k=k if arm != "reactive" else None,
            budgets=BudgetConfig(max_steps=max_steps),
            sampling=SamplingConfig(propose="sample"),
        )
        try:
            result = Planner(engine, env, cfg).run(tasks[i % len(tasks)], episode_id=f"fuzz/{env.name}/{i}")
            append_trace(out / "traces.jsonl", result.trace)
            append_jsonl(out / "results.jsonl", [result.summary.to_dict()])
        except Exception as e:  # noqa: BLE001 - counted and asserted to be none
            report.crashed.append(f"episode {i}: {type(e).__name__}: {e}"[:300])
            continue
        report.episodes += 1
        end = result.trace.end
        if result.summary.status == "errored":
            report.errored.append(f"{result.trace.episode_id}: {(end.error if end else '')[:300]}")
        report.parse_failures += len(result.trace.of_type("parse_failure"))
        report.acts += len(result.trace.of_type("act"))
    report.outputs = feed.served
    return report


def _check(report: FuzzReport, out: Path, pwned: Path) -> None:
    print(
        f"fuzz: {report.outputs} outputs, {report.episodes} episodes, {report.acts} acts, "
        f"{report.parse_failures} parse failures, {len(report.errored)} errored, {len(report.crashed)} crashed"
    )
    assert report.crashed == []
    assert report.errored == []
    assert not pwned.exists()
    traces = read_traces(out / "traces.jsonl", strict=True)  # every line valid UTF-8 JSON
    assert len(traces) == report.episodes and all(t.end is not None for t in traces)
    assert report.parse_failures > report.outputs // 4  # the corpus really reached the parsers


@pytest.fixture
def pwned(tmp_path: Path) -> Path:
    return tmp_path / "pwned"


# -- the parser alone ------------------------------------------------------------------------------
def test_every_fuzzed_text_parses_or_is_refused_with_a_reason(pwned):
    texts = fuzz_corpus(1000, pwned)
    accepted = 0
    for text in texts:
        safe = sanitize_text(text)
        for allowed in (None, TOOLS):
            try:
                action = parse_tool_call(safe, allowed=allowed)
            except ActionParseError as e:
                assert str(e)
                continue
            accepted += 1
            # What is accepted is plain JSON that renders, parses back to the same action and has a key.
            assert parse_tool_call(render_action(action), allowed=allowed) == action
            assert action.key().encode("utf-8")
        try:
            assert ToyEnv().parse_action(safe).key() == " ".join(safe.lower().split())
        except ActionParseError:
            assert not safe.strip() or "\n" in safe.strip()
    assert 0 < accepted < len(texts)
    assert not pwned.exists()


# -- the planner on the toy env and on BFCL ----------------------------------------------------------
def test_fuzzed_outputs_never_crash_the_planner_on_the_toy_env(tmp_path, pwned):
    env = make_env("toy")  # under the step limits of envs/limits.py, as users run it
    report = fuzz_planner(env, env.tasks("dev")[:4], fuzz_corpus(1000, pwned), tmp_path, max_steps=6)
    _check(report, tmp_path, pwned)
    assert report.outputs >= 1000


def test_fuzzed_outputs_never_crash_the_planner_on_bfcl(tmp_path, pwned):
    pytest.importorskip("bfcl_eval")
    env = make_env("bfcl")
    tasks = env.tasks("dev", limit=8)
    # Long episodes with K=4: each reset starts a worker process, so few episodes keep the test fast.
    report = fuzz_planner(env, tasks, fuzz_corpus(1000, pwned, seed=SEED + 1), tmp_path, max_steps=25, k=4)
    env.close()
    _check(report, tmp_path, pwned)
    assert report.outputs >= 1000 and report.acts > 0


@pytest.mark.slow
def test_fuzz_20000_outputs_on_both_envs(tmp_path, pwned):
    pytest.importorskip("bfcl_eval")
    toy, bfcl = make_env("toy"), make_env("bfcl")
    runs = [("toy", toy, toy.tasks("dev"), 12, 2), ("bfcl", bfcl, bfcl.tasks("dev"), 25, 4)]  # (max_steps, K)
    for name, env, tasks, max_steps, k in runs:
        out = tmp_path / name
        report = fuzz_planner(env, tasks, fuzz_corpus(10_000, pwned, seed=SEED + 2), out, max_steps, k)
        _check(report, out, pwned)
    bfcl.close()


# -- the engine boundary ---------------------------------------------------------------------------
def test_sanitize_text_replaces_lone_surrogates_drops_nul_and_caps_length():
    assert sanitize_text("a\udc80b\x00c\ud83d") == "a\ufffdbc\ufffd"
    assert sanitize_text("é😀" * 10, max_chars=3) == "é😀é"
    assert sanitize_text("go east") == "go east"


class BrokenEngine(ScriptedEngine):
    """A scripted engine whose results break the protocol in one chosen way."""

    def __init__(self, fault: str) -> None:
        super().__init__(
            lambda req, _: "go east", lambda req, _: "You are in a room.", lambda req, _: [0.0] * len(req.candidates)
        )
        self.fault = fault

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = super().generate(requests)
        if self.fault == "no_completions":
            results[0].completions = []
        if self.fault == "text_none":
            results[0].completions[0] = Completion(None, 1)  # type: ignore[arg-type]
        if self.fault == "missing_result":
            results = results[:-1]
        return results

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        results = super().score(requests)
        if self.fault == "empty_logprobs":
            results[0].logprobs = []
        if self.fault == "nan_logprob":
            results[0].logprobs = [math.nan] * len(results[0].logprobs)
        return results


@pytest.mark.parametrize(
    "fault,propose,message",
    [
        ("no_completions", "sample", "a GenerationResult with no completions for a request with n=1"),
        ("text_none", "sample", "a completion text of type NoneType, not str"),
        ("missing_result", "sample", "generate returned 0 results for 1 requests"),
        ("empty_logprobs", "score", r"a ScoreResult with 0 logprobs and \d+ token counts for \d+ candidates"),
        ("nan_logprob", "score", r"a ScoreResult with logprob\(s\) \[nan"),
    ],
)
def test_an_engine_that_breaks_the_protocol_ends_the_episode_with_a_clear_error(fault, propose, message):
    env = ToyEnv()
    task = env.tasks("dev")[3]
    cfg = PlannerConfig(arm="reactive", budgets=BudgetConfig(max_steps=3), sampling=SamplingConfig(propose=propose))
    result = Planner(BrokenEngine(fault), env, cfg).run(task)
    assert result.summary.status == "errored"
    error = result.trace.end.error
    assert error.startswith("EngineContractError: BrokenEngine: ") and re.search(message, error)
    assert "(request tag 'decide')" in error
    with pytest.raises(EngineContractError, match="BrokenEngine"):
        Planner(
            BrokenEngine(fault),
            env,
            PlannerConfig(arm="reactive", raise_errors=True, sampling=SamplingConfig(propose=propose)),
        ).run(task)


def test_metered_engine_gives_sanitized_copies_and_leaves_the_backend_results_alone():
    engine = ScriptedEngine(lambda req, _: "go\udc80 east\x00")
    raw = engine.generate([GenerationRequest(prompt="p")])
    metered = MeteredEngine(engine, max_text_chars=4)
    (res,) = metered.generate([GenerationRequest(prompt="p")])
    assert res.completions[0].text == "go\ufffd " and raw[0].completions[0].text == "go\udc80 east\x00"
    with pytest.raises(ValueError, match="max_text_chars"):
        MeteredEngine(engine, max_text_chars=0)


def test_softmax_of_no_or_impossible_candidates():
    from simplan.inference.engines.base import softmax

    assert softmax([]) == []
    assert softmax([-math.inf, -math.inf]) == [0.5, 0.5]
    assert softmax([0.0, -math.inf]) == [1.0, 0.0]


class ChokingToy(ToyEnv):
    """A toy env whose parser fails on some text with an error other than ActionParseError."""

    def parse_action(self, text: str):
        if "boom" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return super().parse_action(text)


def test_an_env_parser_that_chokes_on_model_text_is_a_parse_failure_not_an_error():
    env = ChokingToy()
    cfg = PlannerConfig(arm="reactive", budgets=BudgetConfig(max_steps=2), sampling=SamplingConfig(propose="sample"))
    result = Planner(ScriptedEngine(lambda req, _: "boom", constrained=False), env, cfg).run(env.tasks("dev")[3])
    assert result.summary.status == "budget_steps" and len(result.trace.of_type("act")) == 2  # fallback actions
    reasons = [e.reason for e in result.trace.of_type("parse_failure")]
    assert reasons and all(r.startswith("the env's parser failed: RecursionError") for r in reasons)


def test_jsonl_writers_escape_a_lone_surrogate_instead_of_failing(tmp_path):
    odd, plain = {"text": "a\udc80b", "other": "é"}, {"text": "é"}
    append_jsonl(tmp_path / "a.jsonl", [odd, plain])
    write_jsonl(tmp_path / "w.jsonl", [odd, plain])
    for name in ("a.jsonl", "w.jsonl"):
        lines = (tmp_path / name).read_text(encoding="utf-8").splitlines()
        assert lines == ['{"text": "a\\udc80b", "other": "\\u00e9"}', '{"text": "é"}']  # readable where UTF-8 can be
        assert [json.loads(line) for line in lines] == [odd, plain]


# -- the evaluation goes on ------------------------------------------------------------------------
def _eval_cfg(tmp_path: Path) -> EvalConfig:
    return EvalConfig(suite="toy-dev", episodes=4, out=str(tmp_path / "run"), progress=False, planner={"max_steps": 6})


def test_evaluation_of_a_fuzzing_engine_runs_every_episode_without_errors(tmp_path, pwned):
    feed = Feed(fuzz_corpus(300, pwned))
    engine = ScriptedEngine(feed.respond, feed.respond, lambda req, _: [0.0] * len(req.candidates), constrained=False)
    outcome = evaluate(_eval_cfg(tmp_path), engine, concurrency=2)
    assert outcome.ran == outcome.planned == 12 and outcome.errored == 0
    assert len(read_traces(outcome.traces, strict=True)) == 12


def test_evaluation_goes_on_past_episodes_of_a_broken_engine(tmp_path):
    outcome = evaluate(_eval_cfg(tmp_path), BrokenEngine("empty_logprobs"), concurrency=2)
    assert outcome.ran == outcome.planned == 12 and outcome.errored == 12  # none lost, each with the reason
    ends = [t.end for t in read_traces(outcome.traces, strict=True)]
    assert all("EngineContractError" in e.error for e in ends)

"""Outcomes as a first-class prediction: outcome lines in simulator replies, counterfactual branches behind a shared
prefix in the dataset, and their packed tokenization for training.

    OMP_NUM_THREADS=1 .venv/bin/pytest -q tests/test_outcomes.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from simplan.core.errors import InputError
from simplan.data import format as fmt
from simplan.data.build import BuildConfig, build
from simplan.data.build_branches import branch_messages, kept_alternatives
from simplan.data.collect import CollectConfig, collect
from simplan.data.counterfactual import CounterfactualConfig, collect_counterfactuals
from simplan.data.outcomes import OUTCOMES
from simplan.data.trajectory import Alternative, Trajectory
from simplan.envs.base import Action


@pytest.fixture(scope="module")
def tok():
    from simplan.models.registry import load_tokenizer
    from simplan.models.tiny import tiny_model

    return load_tokenizer(str(tiny_model("llama")))


@pytest.fixture(scope="module")
def counterfactuals(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cf")
    for fold, limit in (("train", 3), ("dev", 1)):
        collect(
            CollectConfig(
                env="toy",
                fold=fold,
                limit=limit,
                policies=["expert", "noisy_expert"],
                branches=0,
                out=str(tmp / f"{fold}.jsonl"),
                progress=False,
            )
        )
    out = tmp / "cf.jsonl"
    collect_counterfactuals(
        CounterfactualConfig(inputs=[str(tmp / "train.jsonl"), str(tmp / "dev.jsonl")], out=str(out), progress=False)
    )
    return out


def test_outcome_lines_round_trip_and_are_strict() -> None:
    for outcome in OUTCOMES:
        reply = fmt.observation_completion("You take the key.", outcome=outcome)
        assert reply.startswith(fmt.outcome_line(outcome)) and fmt.split_outcome(reply) == (
            "You take the key.",
            outcome,
        )
    assert fmt.outcome_line("no_change") == "Outcome: no change\n"
    assert fmt.split_outcome("You see Outcome: lost here.") == ("You see Outcome: lost here.", None)
    assert fmt.split_outcome("Outcome: exploded\nboom") == ("Outcome: exploded\nboom", None)
    with pytest.raises(ValueError, match="outcome"):
        fmt.outcome_line("exploded")


def test_balance_keeps_every_rare_outcome_and_few_that_change_nothing() -> None:
    alts = [Alternative(Action.command(f"a{i}"), "x", outcome=o) for i, o in enumerate(["no_change"] * 5 + ["lost"])]
    kept = kept_alternatives(alts, no_change_per_state=2)
    assert [a.action.text for a in kept] == ["a0", "a1", "a5"]


def test_build_with_outcomes_writes_outcome_lines_and_branch_rows(tmp_path, tok, counterfactuals) -> None:
    result = build(
        BuildConfig(role="simulator", inputs=[str(counterfactuals)], outcomes=True, out=str(tmp_path), progress=False),
        tok,
    )
    from datasets import load_from_disk

    data = load_from_disk(str(tmp_path / "dataset"))
    windows = [r for fold in data for r in data[fold] if not r["branches"]]
    branches = [r for fold in data for r in data[fold] if r["branches"]]
    assert windows and branches
    replies = [m["content"] for r in windows for m, w in zip(r["messages"], r["weights"]) if w]
    assert all(fmt.split_outcome(r)[1] in OUTCOMES for r in replies)
    assert "Outcome:" in windows[0]["messages"][0]["content"]  # the system prompt says what the first line is
    trajs = [Trajectory.from_dict(json.loads(line)) for line in counterfactuals.read_text().splitlines()]
    recorded = {(a.action.text, a.next_observation) for t in trajs for s in t.steps for a in s.alternatives}
    for row in branches:
        assert all(w == 0 for w in row["weights"])  # the prefix's own turns train in the windows
        for b in row["branches"]:
            obs, outcome = fmt.split_outcome(b["reply"])
            assert (b["action"], obs) in recorded and outcome == b["outcome"]
    stats = result.stats["branches"]
    assert stats["branches"] == sum(len(r["branches"]) for r in branches)
    # Expert and noisy paths share their first states: each alternative of a state is trained once.
    keys = [(r["fold"], json.dumps(r["messages"]), b["action"]) for r in branches for b in r["branches"]]
    assert len(keys) == len(set(keys))
    exported = [json.loads(line) for line in Path(result.paths["train"]).read_text().splitlines()]
    weighted = [m for e in exported for m in e["messages"] if m.get("weight")]
    assert len(weighted) >= sum(len(r["branches"]) for r in data["train"] if r["branches"])


def test_outcomes_need_the_conversation_format_and_exclude_verdicts() -> None:
    with pytest.raises(ValueError, match="conversation"):
        BuildConfig(role="simulator", inputs=["x"], out="o", outcomes=True, format="step")
    with pytest.raises(ValueError, match="choose one"):
        BuildConfig(role="simulator", inputs=["x"], out="o", outcomes=True, verdicts=True)


def test_a_branch_row_packs_each_branch_as_its_own_conversation_tokenizes(tok) -> None:
    from simplan.training.examples import IGNORE_INDEX, tokenize_branches, tokenize_conversation
    from simplan.training.packing import PREFIX

    prefix = [
        {"role": "system", "content": "Goal: open the door."},
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": "Outcome: no change\nYou are in room 1."},
    ]
    branches = [
        {"action": "go east", "reply": "Outcome: no change\nRoom 2."},
        {"action": "open door", "reply": "Outcome: lost\nThe door explodes."},
    ]
    packed = tokenize_branches(tok, prefix, branches)
    n = len(tokenize_conversation(tok, prefix, [0] * 3)["input_ids"])
    assert packed["segment_ids"][:n] == [PREFIX] * n and set(packed["labels"][:n]) == {IGNORE_INDEX}
    for i, b in enumerate(branches, start=1):
        messages = branch_messages(prefix, b)
        alone = tokenize_conversation(tok, messages, [0] * 4 + [1])
        idx = [k for k, s in enumerate(packed["segment_ids"]) if s == i]
        assert [packed["input_ids"][k] for k in idx] == alone["input_ids"][n:]
        assert [packed["labels"][k] for k in idx] == alone["labels"][n:]
        assert [packed["position_ids"][k] for k in idx] == list(range(n, len(alone["input_ids"])))


def _train_outcome_simulator(tmp_path, tok, counterfactuals, max_steps: int, batch: int):
    """Build the outcome dataset from the toy counterfactuals and train a tiny llama on it; the TrainResult."""
    from simplan.models.tiny import tiny_model
    from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments
    from simplan.training.trainer import train

    build(
        BuildConfig(
            role="simulator", inputs=[str(counterfactuals)], outcomes=True, out=str(tmp_path / "ds"), progress=False
        ),
        tok,
    )
    return train(
        ModelArguments(model=str(tiny_model("llama")), dtype="float32"),
        LoraArguments(lora_r=4, lora_alpha=8),
        DataArguments(dataset=str(tmp_path / "ds"), max_length=1024, max_eval_examples=4),
        TrainArguments(
            output_dir=str(tmp_path / "run"),
            max_steps=max_steps,
            per_device_train_batch_size=batch,
            eval_steps=0,
            save_steps=100,
            logging_steps=1,
            bf16="false",
            num_threads=1,
        ),
    )


def test_training_on_branch_rows_runs_with_the_tree_mask(tmp_path, tok, counterfactuals) -> None:
    result = _train_outcome_simulator(tmp_path, tok, counterfactuals, max_steps=2, batch=4)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if "loss" in m]
    assert losses and all(0 < float(x) < 100 for x in losses)
    assert all(int(m["tokens_seen"]) > 0 for m in metrics if "tokens_seen" in m)
    assert result.adapter_dir.exists()


# ---------------------------------------------------------------------------------------------
# The planner with a simulator that predicts outcomes
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def traj(tmp_path_factory) -> Trajectory:
    """The toy env's expert path on its first dev task."""
    out = tmp_path_factory.mktemp("expert") / "t.jsonl"
    collect(
        CollectConfig(env="toy", fold="dev", limit=1, policies=["expert"], branches=0, out=str(out), progress=False)
    )
    return Trajectory.from_dict(json.loads(out.read_text().splitlines()[0]))


def _outcome_planner(traj: Trajectory, settings, tok, bad: set[str], judge=None, draft_expectations=True):
    """A simplan planner on the toy env whose decider replays `traj` (K=1) or scores the valid actions, and whose
    simulator gives outcome lines a probability: 'lost' for actions in `bad`, 'no change' otherwise."""
    from simplan.envs.actions import render_action
    from simplan.envs.toy import ToyEnv
    from simplan.inference.engines.scripted import ScriptedEngine
    from simplan.inference.planning.config import ImaginationConfig, PlannerConfig, SamplingConfig
    from simplan.inference.planning.planner import Planner
    from simplan.inference.planning.prompts import PlannerPrompts

    actions = [render_action(s.action) for s in traj.steps]

    def score(req, user):
        if req.tag == "outcomes":
            assert not req.complete and req.candidates == [fmt.outcome_line(o) for o in OUTCOMES]
            want = "lost" if user in bad else "no_change"
            return [0.0 if o == want else -6.0 for o in OUTCOMES]
        order = {a: i for i, a in enumerate(actions)}  # the recorded actions first, in order
        return [-0.1 * order.get(c, 50) for c in req.candidates]

    engine = ScriptedEngine(
        decide=lambda req, user: actions[0],
        simulate=lambda req, user: "Outcome: no change\nYou are here.",
        score=score,
    )
    config = PlannerConfig(
        arm="simplan",
        k=2,
        horizon=1,
        adaptive=False,
        raise_errors=True,
        sampling=SamplingConfig(propose="score"),
        imagination=ImaginationConfig(draft_expectations=draft_expectations),
    )
    planner = Planner(engine, ToyEnv(), config, tokenizer=tok)
    planner.prompts = PlannerPrompts(settings, settings, tok)
    from simplan.inference.planning.imagination import Imagination

    planner.imagination = Imagination(planner)
    if judge is not None:
        planner.imagination.outcome_judge = judge
    return planner, engine


def test_the_planner_reads_outcome_probabilities_and_its_prompts_are_training_prefixes(traj, tok):
    from simplan.data.episode import EpisodeState, PromptSettings, renderer_for

    settings = PromptSettings(budget=4096, reserve=64, outcomes=True)
    planner, engine = _outcome_planner(traj, settings, tok, bad=set())
    result = planner.run(traj.task)
    assert result.summary.success
    # Every outcome request of a real step's top candidate is the simulator's training prompt of that step.
    state = EpisodeState.from_trajectory(traj)
    renderer = renderer_for(settings, tok)
    prefixes = {}
    for ex in renderer.examples(state, "simulator"):
        for i, (m, s, w) in enumerate(zip(ex.messages, ex.steps, ex.weights)):
            if m["role"] == "assistant" and w:
                prefixes[s] = ex.messages[:i]
    firsts = [reqs[0].messages for kind, reqs in engine.calls if kind == "score" and reqs[0].tag == "outcomes"]
    assert firsts == [prefixes[t] for t in range(len(traj.steps))]
    imagine = [e for e in result.trace.events if e.type == "imagine"]
    chosen = [c for e in imagine for c in e.candidates if c.chosen]
    assert all(c.outcome_probs and c.outcome_probs["no_change"] > 0.9 for c in chosen)
    # The expectation, after each real step with the real reply as its draft, its outcome line split off.
    acts = [e for e in result.trace.events if e.type == "act"]
    assert all(not c.predicted for c in chosen) and all(a.expectation == "You are here." for a in acts)
    drafts = [r.draft for kind, reqs in engine.calls if kind == "generate" for r in reqs if r.tag == "simulate"]
    scores = [0.0] + [a.score for a in acts]
    real = ["won" if a.won else "progress" if a.score > s else "no_change" for a, s in zip(acts, scores)]
    assert drafts == [fmt.observation_completion(a.observation, outcome=o) for a, o in zip(acts, real)]
    # Before the step, as without imagination.draft_expectations: the same expectations, on the imagine events.
    planner, engine = _outcome_planner(traj, settings, tok, bad=set(), draft_expectations=False)
    before = planner.run(traj.task)
    chosen = [c for e in before.trace.events if e.type == "imagine" for c in e.candidates if c.chosen]
    assert all(c.predicted == ["You are here."] for c in chosen)
    assert [a.expectation for a in before.trace.events if a.type == "act"] == [a.expectation for a in acts]


def test_the_decider_is_overridden_only_above_the_veto(traj, tok):
    from simplan.data.episode import PromptSettings
    from simplan.inference.planning.outcomes import OutcomeJudge

    first = traj.steps[0].action.text
    settings = PromptSettings(budget=4096, reserve=64, outcomes=True)
    planner, _ = _outcome_planner(traj, settings, tok, bad={first})
    result = planner.run(traj.task)
    (decision, *_) = [e for e in result.trace.events if e.type == "imagine"]
    top, other = decision.candidates[0], decision.candidates[1]
    assert top.actions == [first] and not top.chosen and other.chosen  # P(lost) ~1 > 0.5: vetoed
    planner, _ = _outcome_planner(traj, settings, tok, bad={first}, judge=OutcomeJudge(veto=1.0))
    (decision, *_) = [e for e in planner.run(traj.task).trace.events if e.type == "imagine"]
    assert decision.candidates[0].chosen  # a veto no probability exceeds: the decider's top is always kept


def test_the_learned_pivot_fires_on_a_step_predicted_to_lose_and_not_on_a_safe_one(traj, tok):
    """The toy env goes on after its first expert step, which a hand-made outcome model calls losing: with the
    decider's top kept (veto 1.0), the step is taken and the learned pivot fires on it (its probability from the
    decision's own scoring, no second request); the same episode with a model that calls nothing losing, or with the
    pivot's threshold at 1.0, has no such pivot."""
    from simplan.data.episode import PromptSettings
    from simplan.inference.planning.outcomes import OutcomeJudge
    from simplan.inference.planning.pivots import PivotConfig

    first = traj.steps[0].action.text
    settings = PromptSettings(budget=4096, reserve=64, outcomes=True)

    def run(bad: set[str], loss_pivot: float, on: bool = True):
        planner, engine = _outcome_planner(
            traj, settings, tok, bad=bad, judge=OutcomeJudge(veto=1.0, loss_pivot=loss_pivot)
        )
        planner.config = dataclasses.replace(planner.config, pivot_rules=PivotConfig(predicted_loss=on))
        result = planner.run(traj.task)
        pivots = [e for e in result.trace.events if e.type == "pivot" and e.rule == "predicted_loss"]
        outcome_calls = sum(len(reqs) for kind, reqs in engine.calls if kind == "score" and reqs[0].tag == "outcomes")
        return result, pivots, outcome_calls

    result, pivots, _ = run({first}, 0.5)
    acts = [e for e in result.trace.events if e.type == "act"]
    assert acts[0].action == first and not acts[0].done  # taken, and the episode went on
    (pivot,) = [p for p in pivots if p.step == 1]
    assert pivot.fired and pivot.severity == "error"
    assert pivot.evidence["action"] == first and pivot.evidence["p_lost"] > 0.99 and pivot.evidence["threshold"] == 0.5
    replans = [e for e in result.trace.events if e.type == "replan" and e.step == 1]
    assert replans and "predicted_loss" in replans[0].reason and replans[0].banned == [first]  # not again there
    safe, none, calls_on = run(set(), 0.5)
    assert not none and safe.summary.success
    assert run(set(), 0.5, on=False)[2] == calls_on  # the decision's scoring answers the pivot: no extra request
    assert not run({first}, 1.0)[1]  # no probability exceeds 1.0


def test_the_learned_pivot_checks_what_it_is_given() -> None:
    from simplan.inference.planning.pivots import PivotContext, PredictedLoss, StepRecord

    rule = PredictedLoss(threshold=0.6)
    step = StepRecord("take key", "You take the key.", 0.0)

    def ctx(probs, error=False):
        return PivotContext(history=[dataclasses.replace(step, error=error)], outcome_probs=probs)

    assert rule.check(ctx({"lost": 0.7, "no_change": 0.3})).evidence == {
        "action": "take key",
        "p_lost": 0.7,
        "threshold": 0.6,
    }
    assert rule.check(ctx({"lost": 0.6, "no_change": 0.4})) is None  # over the threshold, not at it (as the veto)
    assert rule.check(ctx(None)) is None  # no outcome model asked
    assert rule.check(ctx({"lost": 0.9}, error=True)) is None  # a failed step is the error rule's
    with pytest.raises(ValueError, match="threshold must be in"):
        PredictedLoss(threshold=1.5)


def test_the_learned_pivot_needs_a_simulator_with_outcomes(tok) -> None:
    from simplan.envs.toy import ToyEnv
    from simplan.inference.engines.scripted import ScriptedEngine
    from simplan.inference.planning.config import PlannerConfig
    from simplan.inference.planning.pivots import PivotConfig
    from simplan.inference.planning.planner import Planner

    engine = ScriptedEngine(decide=lambda req, user: "look", simulate=lambda req, user: "You look.")
    config = PlannerConfig(arm="simplan", pivot_rules=PivotConfig(predicted_loss=True))
    with pytest.raises(InputError, match="needs a simulator trained with outcome lines"):
        Planner(engine, ToyEnv(), config, tokenizer=tok)


def test_outcome_judge_choice_and_file(tmp_path) -> None:
    from simplan.inference.planning.outcomes import OUTCOME_JUDGE_FILE, OutcomeJudge

    def p(**kw):
        base = dict.fromkeys(OUTCOMES, 0.0) | {"no_change": 1.0}
        return base | kw | {"no_change": 1.0 - sum(kw.values())}

    judge = OutcomeJudge(veto=0.4, weights={"logprob": 1.0, "p_progress": 5.0})
    probs = [p(lost=0.5), p(progress=0.1), p(progress=0.6)]
    assert judge.choose([-0.1, -1.0, -2.0], probs)[0] == 2  # vetoed top; the value prefers the progress
    assert judge.choose([-0.1, -1.0, -2.0], [p(lost=0.3), *probs[1:]])[0] == 0  # under the veto: top kept
    assert judge.choose([-0.1, -1.0], [p(lost=0.9), p(error=0.5)])[0] == 1  # all vetoed: the least bad
    judge.write(tmp_path / OUTCOME_JUDGE_FILE)
    assert OutcomeJudge.for_adapter(tmp_path) == judge and OutcomeJudge.for_adapter(None) == OutcomeJudge()
    with pytest.raises(ValueError, match="unknown features"):
        OutcomeJudge(weights={"p_exploded": 1.0})


def test_scoring_a_prefix_leaves_out_the_end_of_turn_token(tok) -> None:
    """ScoreRequest(complete=False) scores an outcome line as the start of a reply: the same tokens without EOS."""
    from simplan.inference.engines.base import ScoreRequest
    from simplan.inference.engines.common import score_rows

    messages = [{"role": "user", "content": "open door"}]
    whole, _ = score_rows(tok, [ScoreRequest(candidates=["Outcome: lost\n"], messages=messages)])
    prefix, _ = score_rows(tok, [ScoreRequest(candidates=["Outcome: lost\n"], messages=messages, complete=False)])
    assert whole[0].ids[:-1] == prefix[0].ids and whole[0].ids[-1] == tok.eos_token_id


# ---------------------------------------------------------------------------------------------
# Fitting the judge, and the metrics of outcome predictions
# ---------------------------------------------------------------------------------------------
def test_outcome_metrics_by_hand() -> None:
    import numpy as np

    from simplan.evaluation.outcome_metrics import auroc, calibration, veto_threshold

    scores, labels = np.array([0.9, 0.8, 0.7, 0.2, 0.1]), np.array([True, True, False, False, True])
    assert auroc(scores, labels) == pytest.approx(4 / 6)  # 4 of the 6 (positive, negative) pairs ordered right
    assert auroc(scores, np.zeros(5, bool)) is None
    t, recall, precision = veto_threshold(scores, labels, precision=1.0)
    assert (t, recall, precision) == (0.7, pytest.approx(2 / 3), 1.0)  # > 0.7 calls the two right ones
    assert veto_threshold(scores, ~labels, precision=1.0)[1] == 0.0  # nothing reaches it: never veto
    c = calibration(np.array([0.05, 0.05, 0.95, 0.95]), np.array([False, False, True, False]), bins=10)
    assert c["ece"] == pytest.approx(0.5 * 0.05 + 0.5 * 0.45)


def test_first_choices_count_what_a_veto_overrides_by_hand() -> None:
    from simplan.evaluation.judge_fit import Row, first_choices

    def row(state: int, logprob: float, outcome: str, p_lost: float) -> Row:
        probs = {o: 0.0 for o in OUTCOMES} | {"lost": p_lost, "no_change": 1 - p_lost}
        return Row("f", state, f"a{state}{logprob}", outcome, False, logprob, probs)

    rows = [
        row(0, -0.1, "lost", 0.9),  # state 0's first choice: bad, and predicted so
        row(0, -2.0, "no_change", 0.1),
        row(1, -0.5, "no_change", 0.6),  # not the first choice: its P(bad) overrides nothing
        row(1, -0.2, "no_change", 0.2),  # state 1's first choice: fine, overridden only by a veto under 0.2
        row(2, -0.3, "error", 0.0),  # state 2's: bad, unforeseen
    ]
    out = first_choices(rows, veto=0.5)
    assert (out["states"], out["bad"]) == (3, 2)
    assert out["at_veto"] == {"threshold": 0.5, "overridden": 1, "rightly": 1}
    assert [(p["overridden"], p["rightly"]) for p in out["probes"]] == [(1, 1), (1, 1), (1, 1)]
    assert first_choices(rows, veto=0.1)["at_veto"] == {"threshold": 0.1, "overridden": 2, "rightly": 1}


def test_the_veto_reaches_its_precision_on_the_population_asked_for(tmp_path, capsys) -> None:
    """Over every candidate no threshold is always right (a good alternative is feared most); over the first
    choices, > 0.8 overrides only the bad one. A refit from rows.jsonl needs no model and gives that judge."""
    from simplan.evaluation.judge_fit import FitJudgeConfig, Row, fit, fit_judge

    def row(state: int, logprob: float, outcome: str, p_lost: float) -> Row:
        probs = {o: 0.0 for o in OUTCOMES} | {"lost": p_lost, "no_change": 1 - p_lost}
        return Row("f", state, f"a{state}{logprob}", outcome, False, logprob, probs)

    rows = [
        row(0, -0.1, "lost", 0.9),  # a bad first choice, foreseen
        row(0, -1.0, "lost", 0.6),
        row(1, -0.1, "no_change", 0.8),  # a good first choice the simulator fears
        row(1, -1.0, "lost", 0.7),
        row(2, -0.1, "no_change", 0.1),
        row(2, -2.0, "no_change", 0.95),  # an alternative the simulator fears most, wrongly
    ]
    assert fit(rows, 1.0, "first_choices").veto == pytest.approx(0.8)  # > 0.8 overrides only state 0's
    # the learned pivot's threshold on P(lost), the same population and precision: > 0.8 calls only state 0's
    judge = fit(rows, 1.0, "first_choices")
    assert judge.loss_pivot == pytest.approx(0.8) and judge.fitted["loss_pivot_recall"] == 1.0
    assert (judge.fitted["loss_pivot_went_on"], judge.fitted["loss_pivot_fires_went_on"]) == (2, 0)
    assert fit(rows, 1.0, "candidates").veto == 1.0  # 0.95 on a good alternative spoils every threshold
    folder = tmp_path / "fit"
    folder.mkdir()
    (folder / "rows.jsonl").write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows))
    refit = fit_judge(
        FitJudgeConfig(
            rows=str(folder / "rows.jsonl"), out=str(tmp_path / "refit"), precision=1.0, veto_on="first_choices"
        ),
        None,
    )
    assert refit["judge"].veto == pytest.approx(0.8) and refit["judge"].fitted["veto_on"] == "first_choices"
    assert "on first_choices" in (tmp_path / "refit" / "metrics.md").read_text()
    with pytest.raises(ValueError, match="veto_on: 'all' is not one of"):
        FitJudgeConfig(rows="r.jsonl", veto_on="all")


def test_the_fitted_judge_recovers_known_weights_on_synthetic_data() -> None:
    import numpy as np

    from simplan.evaluation.outcome_metrics import fit_logistic

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20_000, 3))
    true_w, true_b = np.array([1.5, -2.0, 0.5]), -0.3
    y = (rng.random(20_000) < 1 / (1 + np.exp(-(x @ true_w + true_b)))).astype(float)
    w, b = fit_logistic(x, y, l2=0.0)
    assert np.allclose(w, true_w, atol=0.08) and b == pytest.approx(true_b, abs=0.08)


def test_fit_judge_on_toy_counterfactuals(tmp_path, tok, counterfactuals) -> None:
    """The whole fit on a tiny model: rows for every sampled candidate, metrics, and a judge the planner reads."""
    from simplan.evaluation.judge_fit import FitJudgeConfig, fit_judge
    from simplan.inference.engines import make_engine
    from simplan.inference.planning.outcomes import OUTCOME_JUDGE_FILE, OutcomeJudge
    from simplan.models.tiny import tiny_model

    result = _train_outcome_simulator(tmp_path, tok, counterfactuals, max_steps=1, batch=2)
    adapter = str(result.adapter_dir)
    engine = make_engine(
        "hf", str(tiny_model("llama")), {"decider": adapter, "simulator": adapter}, dtype="float32", threads=1
    )
    try:
        out = fit_judge(
            FitJudgeConfig(inputs=[str(counterfactuals)], out=str(tmp_path / "fit"), states=6, write_adapter=True),
            engine,
        )
    finally:
        engine.close()
    rows = (tmp_path / "fit" / "rows.jsonl").read_text().splitlines()
    assert len(rows) == out["metrics"]["all"]["candidates"] >= 6
    for line in rows:
        r = json.loads(line)
        assert sum(r["probs"].values()) == pytest.approx(1.0) and r["logprob"] <= 0.0
    judge = OutcomeJudge.for_adapter(adapter)
    assert (Path(adapter) / OUTCOME_JUDGE_FILE).exists() and judge == out["judge"]
    assert "AUROC" in (tmp_path / "fit" / "metrics.md").read_text()
    assert out["metrics"]["first_choices"]["states"] == 6


def test_outcome_probabilities_are_the_same_batched_and_one_by_one(tok) -> None:
    from simplan.inference.engines import make_engine
    from simplan.inference.planning.outcomes import outcome_probabilities, outcome_request
    from simplan.models.tiny import tiny_model

    engine = make_engine("hf", str(tiny_model("llama")), dtype="float32", threads=1, batch_size=4)
    try:
        prompts = [
            [{"role": "system", "content": f"Goal: {g}"}, {"role": "user", "content": a}]
            for g, a in (("open the door", "open door"), ("find the key", "look"), ("win", "go east now"))
        ]
        batched = outcome_probabilities(engine.score([outcome_request(m, None) for m in prompts]))
        alone = [outcome_probabilities(engine.score([outcome_request(m, None)]))[0] for m in prompts]
    finally:
        engine.close()
    for b, a in zip(batched, alone):
        assert sum(b.values()) == pytest.approx(1.0)
        assert all(b[o] == pytest.approx(a[o], abs=1e-5) for o in OUTCOMES)

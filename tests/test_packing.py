"""Branch packing: one prefix + K branches in one tree-masked sequence gives the losses of K separate sequences.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q tests/test_packing.py

On the tiny random llama in fp32, with sdpa and eager attention, with and without a LoRA adapter (random
non-zero B, so it changes the output): per-branch and summed token losses and the LoRA gradients of the
packed layout equal those of the branches fed one by one within RTOL; a branch's logits do not move when
another branch's tokens change (they do under a plain causal mask); padding in a batch changes nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from transformers import AutoModelForCausalLM  # noqa: E402

from simplan.models.tiny import tiny_model  # noqa: E402
from simplan.training.completion_trainer import completion_loss  # noqa: E402
from simplan.training.examples import PaddingCollator  # noqa: E402
from simplan.training.packing import IGNORE_INDEX, BranchCollator, PackedExample, one_by_one, pack_branches  # noqa: E402

torch.set_num_threads(1)

RTOL = 1e-4  # fp32; measured: <= 7e-7 relative on losses and LoRA gradients (summation order differs)
PAD = 0
# (action length, reply length) of each branch: replies carry loss, actions do not
SHAPES = [(6, 5), (3, 9), (8, 4)]


def _branches(seed: int = 0, shapes: list[tuple[int, int]] = SHAPES) -> tuple[list[int], list[tuple]]:
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(1, 2000, (n,), generator=g).tolist()

    prefix = ids(37)
    branches = []
    for n_action, n_reply in shapes:
        action, reply = ids(n_action), ids(n_reply)
        branches.append((action + reply, [IGNORE_INDEX] * n_action + reply))
    return prefix, branches


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def base(request: pytest.FixtureRequest) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model("llama"), dtype=torch.float32, attn_implementation=request.param
    )
    return model.eval()


@pytest.fixture(scope="module")
def lora(base: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(1)
    cfg = peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], lora_dropout=0.0
    )
    model = peft.get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)  # peft starts B at zero (adapter == base); make it change the output
    return model.eval()


def _token_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(batch, n - 1) cross-entropy of the token at t + 1 given the logits at t; 0 where the label is ignored."""
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits.float()
    targets = batch["labels"][:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
    )
    return losses


def _packed_branch_losses(model: torch.nn.Module, packed: PackedExample) -> torch.Tensor:
    losses = _token_losses(model, BranchCollator(PAD)([packed]))[0]
    segments = torch.tensor(packed.segment_ids[1:])
    return torch.stack([losses[segments == s].sum() for s in range(1, max(packed.segment_ids) + 1)])


def _one_by_one_losses(model: torch.nn.Module, prefix: list[int], branches: list[tuple]) -> torch.Tensor:
    return torch.stack([_token_losses(model, PaddingCollator(PAD)([f])).sum() for f in one_by_one(prefix, branches)])


def test_layout_positions_and_tree() -> None:
    packed = pack_branches([5, 6, 7], [([8, 9], [IGNORE_INDEX, 9]), ([10, 11, 12], [IGNORE_INDEX, IGNORE_INDEX, 12])])
    assert packed.input_ids == [5, 6, 7, 8, 9, 10, 11, 12]
    assert packed.labels == [IGNORE_INDEX] * 4 + [9] + [IGNORE_INDEX] * 2 + [12]
    assert packed.position_ids == [0, 1, 2, 3, 4, 3, 4, 5]
    assert packed.segment_ids == [0, 0, 0, 1, 1, 2, 2, 2]
    row = packed.allowed()[6].tolist()  # second token of branch 2: the prefix, then its own branch only
    assert row == [True, True, True, False, False, True, True, False]
    assert packed.allowed()[2].tolist() == [True] * 3 + [False] * 5  # the prefix never sees a branch


@pytest.mark.parametrize(
    "prefix, branches, field",
    [
        ([], [([1], [IGNORE_INDEX])], "prefix_ids"),
        ([1], [], "branches"),
        ([1], [([1, 2], [IGNORE_INDEX])], "branch 0"),
        ([1], [([1], [IGNORE_INDEX]), ([2, 3], [2, 3])], "branch 1: its first label"),
    ],
)
def test_bad_branches_are_refused(prefix: list[int], branches: list[tuple], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        pack_branches(prefix, branches)


def test_mask_is_additive_with_padding_masked() -> None:
    short = pack_branches([1, 2], [([3, 4], [IGNORE_INDEX, 4])])
    long = pack_branches([1, 2, 3], [([4, 5], [IGNORE_INDEX, 5]), ([6], [IGNORE_INDEX])])
    batch = BranchCollator(PAD)([short, long])
    mask = batch["attention_mask"]
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.float32
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float32).min}
    assert (mask[0, 0, :4, 4:] < 0).all()  # no real token attends to padding
    assert mask[0, 0, 5].tolist() == [torch.finfo(torch.float32).min] * 5 + [0.0]  # padding: only itself
    assert batch["labels"][0, 4:].tolist() == [IGNORE_INDEX] * 2
    rows = [dataclasses.asdict(x) | {"length": len(x.input_ids)} for x in (short, long)]  # dataset rows
    for key, value in BranchCollator(PAD)(rows).items():
        assert torch.equal(value, batch[key]), key


def _losses(model: torch.nn.Module, prefix: list[int], branches: list[tuple]) -> tuple[torch.Tensor, ...]:
    """Per-branch losses packed and one by one, and the trainer's summed loss of the packed batch."""
    with torch.no_grad():
        packed = _packed_branch_losses(model, pack_branches(prefix, branches))
        alone = _one_by_one_losses(model, prefix, branches)
        # labels shifted by the model, LM head at labelled positions only (training/completion_trainer.py)
        trainer_sum = completion_loss(model, BranchCollator(PAD)([pack_branches(prefix, branches)]), 1)
    return packed, alone, trainer_sum


@pytest.mark.parametrize("adapter", [False, True], ids=["base", "lora"])
def test_packed_losses_equal_one_by_one(lora: torch.nn.Module, adapter: bool) -> None:
    prefix, branches = _branches()
    with lora.disable_adapter():
        base_losses = _losses(lora, prefix, branches)
    packed, alone, trainer_sum = _losses(lora, prefix, branches) if adapter else base_losses
    assert packed.shape == (len(SHAPES),)
    torch.testing.assert_close(packed, alone, rtol=RTOL, atol=0)
    torch.testing.assert_close(trainer_sum, alone.sum(), rtol=RTOL, atol=0)
    if adapter:  # the adapter changes the losses, so the equality above is about the adapted model
        assert (alone - base_losses[1]).abs().max() > 1e-2


def test_lora_gradients_equal_one_by_one(lora: torch.nn.Module) -> None:
    prefix, branches = _branches(seed=1)
    params = [p for n, p in lora.named_parameters() if "lora_" in n]

    def grads(loss: torch.Tensor) -> torch.Tensor:
        lora.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in params])

    packed = grads(completion_loss(lora, BranchCollator(PAD)([pack_branches(prefix, branches)]), 1))
    alone = grads(completion_loss(lora, PaddingCollator(PAD)(one_by_one(prefix, branches)), 1))
    lora.zero_grad()
    assert alone.norm() > 0
    assert (packed - alone).norm() / alone.norm() < RTOL
    torch.testing.assert_close(packed, alone, rtol=RTOL, atol=RTOL * alone.abs().max().item())


def _logits(model: torch.nn.Module, batch: dict[str, torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"} | ({} if mask is None else {"attention_mask": mask})
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits[0]


def test_no_branch_sees_another(lora: torch.nn.Module) -> None:
    prefix, branches = _branches(seed=2)
    _, other = _branches(seed=3)
    changed = [branches[0], other[1], branches[2]]  # branch 2 replaced by other tokens of the same length
    a, b = pack_branches(prefix, branches), pack_branches(prefix, changed)
    middle = torch.tensor(a.segment_ids) == 2
    assert a.input_ids != b.input_ids
    la, lb = _logits(lora, BranchCollator(PAD)([a])), _logits(lora, BranchCollator(PAD)([b]))
    torch.testing.assert_close(la[~middle], lb[~middle], rtol=0, atol=1e-6)
    # the check can see a leak: under a plain causal mask (a 2D mask of ones; without one transformers would
    # read sequence starts from the position ids) the third branch reads the second
    last = torch.tensor(a.segment_ids) == 3
    ones = torch.ones(1, len(a.input_ids), dtype=torch.long)
    leaky = [
        _logits(lora, {"input_ids": torch.tensor([x.input_ids]), "position_ids": torch.tensor([x.position_ids])}, ones)
        for x in (a, b)
    ]
    assert (leaky[0][last] - leaky[1][last]).abs().max() > 1e-3


def test_padding_in_a_batch_changes_nothing(lora: torch.nn.Module) -> None:
    short = pack_branches(*_branches(seed=4, shapes=[(2, 3), (4, 2)]))
    long = pack_branches(*_branches(seed=5))
    n = len(short.input_ids)
    alone = _logits(lora, BranchCollator(PAD)([short]))
    with torch.no_grad():
        batch = BranchCollator(PAD)([short, long])
        together = lora(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0, :n]
        summed = completion_loss(lora, batch, 1)
        parts = sum(completion_loss(lora, BranchCollator(PAD)([x]), 1) for x in (short, long))
    assert batch["input_ids"].shape[1] > n
    torch.testing.assert_close(together, alone, rtol=RTOL, atol=1e-5)
    torch.testing.assert_close(summed, parts, rtol=RTOL, atol=0)

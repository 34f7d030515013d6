"""K alternative branches of one state in one sequence: the prefix is encoded once, not K times.

    from simplan.training.packing import BranchCollator, pack_branches
    packed = pack_branches(prefix_ids, [(action_1 + reply_1, labels_1), (action_2 + reply_2, labels_2)])
    batch = BranchCollator(tokenizer.pad_token_id)([packed, other_packed])
    loss = model(**batch).loss          # or training/completion_trainer.py's completion_loss(model, batch)

A packed sequence is [prefix][branch 1]...[branch K]. Its attention is a tree: the prefix attends causally
to itself, and every branch token attends to the whole prefix and causally to its own branch, never to
another branch. Each branch's position ids continue from len(prefix), so branch i sees exactly the positions
and keys it would see as the causal sequence prefix + branch i (`one_by_one` builds that layout). The loss
of a packed example is therefore the sum of the branches' losses fed one by one, at the cost of
len(prefix) + sum(len(branch)) tokens instead of K * len(prefix) + sum(len(branch)).

Labels follow the transformers convention (the label at t is the token the logits at t - 1 predict; the
model shifts). Every branch must open with an unlabelled token (its action's first token): the position
before it belongs to the previous branch or the prefix, so a label there would be predicted from the wrong
context. The collator passes a 4D additive float mask (batch, 1, q, k), 0 where a token attends and the
dtype's minimum elsewhere; transformers' `create_causal_mask` returns a 4D mask as given, and both the
sdpa and the eager attention add it to the scores. Flash-attention and flex implementations do not take it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from simplan.training.examples import IGNORE_INDEX

PREFIX = 0  # segment id of the shared prefix; branch i (0-based) has segment id i + 1
FIELDS = ("input_ids", "labels", "position_ids", "segment_ids")  # of PackedExample, in order; a row may have more


@dataclass(frozen=True)
class PackedExample:
    """One prefix and its branches as one sequence; `segment_ids` carries the tree (see `allowed`).

    `dataclasses.asdict` makes it a row (of a `datasets.Dataset`, say); `BranchCollator` takes either."""

    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    segment_ids: list[int]

    def allowed(self) -> torch.Tensor:
        """Boolean (n, n): query q may attend to key k. Causal, and a key is the prefix or q's own branch."""
        seg = torch.tensor(self.segment_ids)
        causal = torch.ones(len(seg), len(seg), dtype=torch.bool).tril()
        return causal & ((seg[None, :] == PREFIX) | (seg[None, :] == seg[:, None]))


def _check(prefix_ids: list[int], branches: Sequence[tuple[list[int], list[int]]]) -> None:
    if not prefix_ids:
        raise ValueError("prefix_ids is empty: a branch needs a state to branch from")
    if not branches:
        raise ValueError("branches is empty: give at least one (input_ids, labels) pair")
    for i, (ids, labels) in enumerate(branches):
        if not ids or len(ids) != len(labels):
            raise ValueError(f"branch {i}: {len(ids)} input_ids and {len(labels)} labels; both must be equal, > 0")
        if labels[0] != IGNORE_INDEX:
            raise ValueError(
                f"branch {i}: its first label is {labels[0]}, not {IGNORE_INDEX}; a branch must open with an "
                "unlabelled token (the action), since the position before it is shared by all branches"
            )


def pack_branches(prefix_ids: list[int], branches: Sequence[tuple[list[int], list[int]]]) -> PackedExample:
    """[prefix][branch 1]...[branch K] with per-branch positions; branches are (input_ids, labels) pairs."""
    _check(prefix_ids, branches)
    ids, labels = list(prefix_ids), [IGNORE_INDEX] * len(prefix_ids)
    positions, segments = list(range(len(prefix_ids))), [PREFIX] * len(prefix_ids)
    for i, (branch_ids, branch_labels) in enumerate(branches):
        ids += branch_ids
        labels += branch_labels
        positions += range(len(prefix_ids), len(prefix_ids) + len(branch_ids))
        segments += [i + 1] * len(branch_ids)
    return PackedExample(ids, labels, positions, segments)


def one_by_one(prefix_ids: list[int], branches: Sequence[tuple[list[int], list[int]]]) -> list[dict[str, list[int]]]:
    """The same branches as K causal sequences prefix + branch, for training/examples.py's PaddingCollator."""
    _check(prefix_ids, branches)
    return [
        {"input_ids": list(prefix_ids) + list(ids), "labels": [IGNORE_INDEX] * len(prefix_ids) + list(labels)}
        for ids, labels in branches
    ]


@dataclass
class BranchCollator:
    """Right-pads packed examples into a batch for `model(**batch)`: input_ids, labels, position_ids and
    the 4D additive attention mask. A padding token attends only to itself (so no row of the mask is empty)
    and no real token attends to padding; padding carries no loss.

    `dtype` is the dtype of the attention scores (the model's compute dtype): sdpa wants the mask's dtype
    to match the queries'.
    """

    pad_token_id: int
    dtype: torch.dtype = torch.float32

    def __call__(self, features: Sequence[PackedExample | Mapping[str, list[int]]]) -> dict[str, torch.Tensor]:
        rows = [f if isinstance(f, PackedExample) else PackedExample(*(f[k] for k in FIELDS)) for f in features]
        n = max(len(r.input_ids) for r in rows)
        ids = torch.full((len(rows), n), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), n), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros((len(rows), n), dtype=torch.long)
        allowed = torch.eye(n, dtype=torch.bool).repeat(len(rows), 1, 1)
        for i, r in enumerate(rows):
            m = len(r.input_ids)
            ids[i, :m] = torch.tensor(r.input_ids)
            labels[i, :m] = torch.tensor(r.labels)
            positions[i, :m] = torch.tensor(r.position_ids)
            allowed[i, :m, :m] = r.allowed()
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill(~allowed, torch.finfo(self.dtype).min)
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "attention_mask": mask[:, None]}

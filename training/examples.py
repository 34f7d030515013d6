"""Training examples: a `simplan build` dataset loaded by fold, tokenized with completion-only labels, batched.

    from simplan.training.examples import PaddingCollator, load_splits, tokenize_dataset
    train_raw, dev_raw = load_splits(DataArguments(dataset="runs/datasets/twx-decider"))
    train_ds, dropped = tokenize_dataset(train_raw, tokenizer, max_length=2048)   # dropped: over max_length
    batch = PaddingCollator(tokenizer.pad_token_id)([train_ds[0], train_ds[1]])

Prompts and conversations go through the model's chat template (data/format.py, data/episode.py: the
formats inference uses too). A conversation row (`messages` + `weights`) carries loss on every assistant
turn of weight 1 and on the EOS the template writes after it; a per-step row (`prompt` + `completion`) on
its completion + EOS; every other position is labelled `IGNORE_INDEX`. Examples longer than `max_length`
are dropped and counted, never cut. `PaddingCollator` pads a batch to its longest example;
`PackingCollator` packs it into one row whose position ids restart at every example.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from simplan.core.errors import InputError, MissingInputError
from simplan.data.episode import PromptSettings, read_settings
from simplan.data.format import completion_text, prompt_text
from simplan.training.config import DataArguments

IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------------------
# Data: tokenization with completion-only labels, and the two collators
# ---------------------------------------------------------------------------------------------
def tokenize_example(tokenizer: Any, prompt: list[dict[str, str]], completion: str) -> dict[str, list[int]]:
    """input_ids and labels for one example: prompt via the chat template, completion + EOS, prompt masked."""
    prompt_ids = tokenizer(prompt_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion_text(tokenizer, completion), add_special_tokens=False)["input_ids"]
    return {
        "input_ids": prompt_ids + completion_ids,
        "labels": [IGNORE_INDEX] * len(prompt_ids) + list(completion_ids),
    }


def assistant_spans(
    tokenizer: Any, messages: list[dict[str, str]], weights: list[int]
) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text (chat template) and the character spans that carry loss: the content of
    every assistant turn with weight > 0 and the EOS the template writes after it (so the model learns
    to stop). Each span is located by rendering the conversation up to that turn with the generation
    prompt, so a template that renders a prefix differently from the whole is caught, not trained on."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    eos = tokenizer.eos_token or ""
    spans = []
    for i, (m, w) in enumerate(zip(messages, weights)):
        if m["role"] != "assistant" or not w:
            continue
        head = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False)
        end = len(head) + len(m["content"])
        if not text.startswith(head) or text[len(head) : end] != m["content"]:
            raise InputError(
                f"the chat template does not render assistant turn {i} after its prompt as it renders the prompt "
                "alone (a template that rewrites earlier turns, e.g. drops reasoning); train with `simplan build "
                "--format step` data or a prefix-preserving template"
            )
        if eos and text.startswith(eos, end):
            end += len(eos)
        spans.append((len(head), end))
    return text, spans


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]], weights: list[int]) -> dict[str, list[int]]:
    """input_ids and labels of one multi-turn sequence: labels only on the weighted assistant turns (+ EOS)."""
    text, spans = assistant_spans(tokenizer, messages, weights)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [IGNORE_INDEX] * len(enc["input_ids"])
    for k, (a, b) in enumerate(enc["offset_mapping"]):
        if any(a < end and b > start for start, end in spans):
            labels[k] = enc["input_ids"][k]
    return {"input_ids": list(enc["input_ids"]), "labels": labels}


def tokenize_dataset(dataset: Any, tokenizer: Any, max_length: int, desc: str = "tokenize") -> tuple[Any, int]:
    """Tokenize a `datasets.Dataset` from `simplan build`; returns (tokenized, number dropped).

    Conversation rows (`messages` + `weights`) carry loss on their weighted assistant turns; per-step
    rows (`prompt` + `completion`) on the completion."""
    columns = dataset.column_names
    if "weights" in columns and "messages" in columns:
        if has_branches(dataset):
            return _tokenize(dataset, max_length, desc, _branch_encoder(tokenizer))
        return _tokenize(dataset, max_length, desc, _conversation_encoder(tokenizer))
    for column in ("prompt", "completion"):
        if column not in columns:
            raise InputError(
                f"dataset has no {column!r} column (columns: {columns}); build it with `simplan build`, which "
                "writes messages + weights (conversation) or prompt + completion (step)"
            )
    return _tokenize(dataset, max_length, desc, _step_encoder(tokenizer))


def _conversation_encoder(tokenizer: Any) -> Any:
    def encode(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {"input_ids": [], "labels": [], "length": []}
        for messages, weights in zip(batch["messages"], batch["weights"]):
            ex = tokenize_conversation(tokenizer, messages, weights)
            out["input_ids"].append(ex["input_ids"])
            out["labels"].append(ex["labels"])
            out["length"].append(len(ex["input_ids"]))
        return out

    return encode


def has_branches(dataset: Any) -> bool:
    """Whether a conversation dataset holds branch rows (counterfactual alternatives behind a shared prefix,
    data/build_branches.py): then every row is tokenized with position and segment ids for BranchCollator."""
    return "branches" in dataset.column_names and any(len(b) for b in dataset["branches"])


def tokenize_branches(
    tokenizer: Any, prefix: list[dict[str, str]], branches: list[dict[str, Any]]
) -> dict[str, list[int]]:
    """A branch row as one packed sequence (training/packing.py): the prefix once, then each branch's action and
    reply, loss on the replies (+ EOS) only. Each branch is tokenized as the whole conversation prefix + branch,
    so its tokens are exactly those of that conversation; a template that renders the prefix differently inside
    a longer conversation is refused."""
    from simplan.data.build_branches import branch_messages
    from simplan.training.packing import pack_branches

    prefix_ids = tokenize_conversation(tokenizer, prefix, [0] * len(prefix))["input_ids"]
    parts = []
    for b in branches:
        messages = branch_messages(prefix, b)
        whole = tokenize_conversation(tokenizer, messages, [0] * (len(messages) - 1) + [1])
        if whole["input_ids"][: len(prefix_ids)] != prefix_ids:
            raise InputError(
                "the chat template renders a conversation's start differently once a turn follows; branch rows "
                "need a prefix-preserving template (build without --outcomes, or use another model)"
            )
        parts.append((whole["input_ids"][len(prefix_ids) :], whole["labels"][len(prefix_ids) :]))
    return asdict(pack_branches(prefix_ids, parts))


def _branch_encoder(tokenizer: Any) -> Any:
    """Conversation rows with position and segment ids: windows as one causal segment, branch rows packed."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {k: [] for k in ("input_ids", "labels", "position_ids", "segment_ids", "length")}
        for messages, weights, branches in zip(batch["messages"], batch["weights"], batch["branches"]):
            if branches:
                ex = tokenize_branches(tokenizer, messages, branches)
            else:
                ex = tokenize_conversation(tokenizer, messages, weights)
                ex |= {"position_ids": list(range(len(ex["input_ids"]))), "segment_ids": [0] * len(ex["input_ids"])}
            for k in ("input_ids", "labels", "position_ids", "segment_ids"):
                out[k].append(ex[k])
            out["length"].append(len(ex["input_ids"]))
        return out

    return encode


def _step_encoder(tokenizer: Any) -> Any:
    def encode(batch: dict[str, list]) -> dict[str, list]:
        prompts = [prompt_text(tokenizer, p) for p in batch["prompt"]]
        completions = [completion_text(tokenizer, c) for c in batch["completion"]]
        p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
        out: dict[str, list] = {"input_ids": [], "labels": [], "length": []}
        for p, c in zip(p_ids, c_ids):
            out["input_ids"].append(p + c)
            out["labels"].append([IGNORE_INDEX] * len(p) + c)
            out["length"].append(len(p) + len(c))
        return out

    return encode


def _tokenize(dataset: Any, max_length: int, desc: str, encode: Any) -> tuple[Any, int]:
    tokenized = dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc=desc)
    before = len(tokenized)
    tokenized = tokenized.filter(lambda n: n <= max_length, input_columns="length", desc=f"{desc}: length filter")
    return tokenized, before - len(tokenized)


@dataclass
class PaddingCollator:
    """Right-pads a batch to its longest example; padding is masked out and carries no loss."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            longest = math.ceil(longest / self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = torch.full((len(features), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(features), longest), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.tensor(f["input_ids"])
            labels[i, :n] = torch.tensor(f["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@dataclass
class PackingCollator:
    """Concatenates a batch into one row with position ids restarting at each example, and no padding.

    Without an attention mask, transformers reads example boundaries from the position ids and
    builds a block-diagonal causal mask (sdpa/eager) or calls varlen flash attention, so no token
    attends to another example. Each example's first token is a prompt token (label -100), so no
    loss crosses a boundary either.
    """

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for f in features:
            ids += f["input_ids"]
            labels += [IGNORE_INDEX] + list(f["labels"][1:])
            positions += range(len(f["input_ids"]))
        return {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions]),
        }


def load_splits(data_args: DataArguments) -> tuple[Any, Any | None]:
    from datasets import load_from_disk

    folder = Path(data_args.dataset)
    if (folder / "dataset" / "dataset_dict.json").exists():  # the `simplan build --out` folder
        folder = folder / "dataset"
    if not folder.exists():
        raise MissingInputError(f"dataset: {folder} does not exist; build it with `simplan build --out {folder} ...`")
    data = load_from_disk(str(folder))
    if not hasattr(data, "keys"):
        raise InputError(
            f"dataset: {folder} holds a single Dataset; expected a DatasetDict by fold from `simplan build`"
        )
    if data_args.train_split not in data:
        raise InputError(f"train_split: {data_args.train_split!r} is not a fold of {folder} (folds: {list(data)})")
    train = data[data_args.train_split]
    if data_args.max_train_examples:
        train = train.select(range(min(len(train), data_args.max_train_examples)))
    dev = None
    if data_args.eval_split and data_args.eval_split in data and len(data[data_args.eval_split]):
        dev = data[data_args.eval_split]
        if data_args.max_eval_examples:
            dev = dev.shuffle(seed=0).select(range(min(len(dev), data_args.max_eval_examples)))
    return train, dev


def dataset_settings(data_args: DataArguments) -> PromptSettings | None:
    """The prompt settings the dataset was built with (None for a dataset built before they travelled)."""
    folder = Path(data_args.dataset)
    return read_settings(folder) or (read_settings(folder.parent) if folder.name == "dataset" else None)


@dataclass
class TokenizedSplits:
    """The train and dev folds of a run, tokenized; `dev` is None when there is none (or nothing fits)."""

    train: Any
    dev: Any | None
    dropped_train: int  # examples over max_length
    dropped_dev: int


def tokenized_splits(data_args: DataArguments, tokenizer: Any) -> TokenizedSplits:
    """`load_splits`, then `tokenize_dataset` on each fold; raises when no training example fits `max_length`."""
    train_raw, dev_raw = load_splits(data_args)
    train_ds, dropped_train = tokenize_dataset(train_raw, tokenizer, data_args.max_length, "tokenize train")
    if len(train_ds) == 0:
        raise InputError(
            f"max_length: all {dropped_train} training examples of {data_args.dataset} are longer than "
            f"{data_args.max_length} tokens; raise max_length or rebuild the dataset with a smaller prompt budget"
        )
    dev_ds, dropped_dev = (None, 0)
    if dev_raw is not None:
        dev_ds, dropped_dev = tokenize_dataset(dev_raw, tokenizer, data_args.max_length, "tokenize dev")
        dev_ds = dev_ds if len(dev_ds) else None
    return TokenizedSplits(train_ds, dev_ds, dropped_train, dropped_dev)

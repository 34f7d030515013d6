"""Memory of CPU training: the chunked LM-head loss gives the loss and gradients of the one-piece loss.

.venv/bin/python -m pytest -q tests/test_training_memory.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from simplan.models.tiny import tiny_model  # noqa: E402
from simplan.training.completion_trainer import ChunkedHeadLoss, completion_loss  # noqa: E402
from simplan.training.examples import PackingCollator, PaddingCollator, tokenize_conversation  # noqa: E402

CONVERSATION = [
    {"role": "system", "content": "You play a text game."},
    {"role": "user", "content": "You are in room 1 of 3. A key lies on the floor."},
    {"role": "assistant", "content": "take key"},
    {"role": "user", "content": "You take the key."},
    {"role": "assistant", "content": "go east"},
    {"role": "user", "content": "You are in room 2 of 3."},
    {"role": "assistant", "content": "go east now"},
]


def _features(tokenizer) -> list[dict[str, list[int]]]:
    """Windows of different lengths, with a weight-0 turn, as `simplan build` writes them."""
    weights = [0, 0, 1, 0, 0, 0, 1]
    return [
        tokenize_conversation(tokenizer, CONVERSATION[: 3 + 2 * k], weights[: 3 + 2 * k] if k else [0, 0, 1])
        for k in range(3)
    ]


def _lora_model(arch: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_model(arch)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    # B != 0 (init_lora_weights=False), so the LoRA path changes the hidden states the head reads
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    return peft.get_peft_model(model, config), AutoTokenizer.from_pretrained(folder)


def _loss_and_grads(model, batch, chunk: int, bf16: bool) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = completion_loss(model, batch, num_items_in_batch=7, lm_head_chunk=chunk)
    loss.backward()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.requires_grad])
    return loss.item(), grads


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("collator", ["padded", "packed"])
def test_chunked_head_gives_the_loss_and_gradients_of_the_whole_head(arch: str, collator: str) -> None:
    model, tok = _lora_model(arch, torch.float32)
    model.eval()  # no dropout: both paths see the same network
    feats = _features(tok)
    batch = PaddingCollator(tok.pad_token_id)(feats) if collator == "padded" else PackingCollator()(feats)
    whole, whole_grads = _loss_and_grads(model, batch, 0, bf16=False)
    chunked, chunked_grads = _loss_and_grads(model, batch, 5, bf16=False)  # 5 tokens a chunk: several chunks
    assert chunked == pytest.approx(whole, rel=1e-6)
    # fp32 sums in another order: ~1e-6 apart on gradients up to ~5 (AMD and Intel kernels round differently);
    # a wrong chunk would be off by the gradient's own size
    scale = whole_grads.abs().max().item()
    torch.testing.assert_close(chunked_grads, whole_grads, rtol=1e-4, atol=1e-5 * scale)
    padded = PaddingCollator(tok.pad_token_id)(feats)
    with torch.no_grad():  # the model's own full-logits loss (a mean) on the padded batch
        reference = model(**padded).loss.item() * int((padded["labels"][:, 1:] != -100).sum()) / 7
    assert chunked == pytest.approx(reference, rel=1e-4)


def test_chunked_head_under_bf16_autocast_is_within_bf16_rounding() -> None:
    model, tok = _lora_model("llama", torch.bfloat16)
    model.eval()
    batch = PaddingCollator(tok.pad_token_id)(_features(tok))
    whole, whole_grads = _loss_and_grads(model, batch, 0, bf16=True)
    chunked, chunked_grads = _loss_and_grads(model, batch, 5, bf16=True)
    assert chunked == pytest.approx(whole, rel=1e-4)
    assert ((chunked_grads - whole_grads).norm() / whole_grads.norm()).item() < 0.02  # bf16 keeps ~3 digits


def test_chunked_head_keeps_no_logits_for_the_backward() -> None:
    """What autograd saves for the loss is one gradient per labelled token, not a vocab-wide row per token."""
    hidden = torch.randn(40, 16, requires_grad=True)
    weight = torch.randn(1000, 16)
    targets = torch.randint(0, 1000, (40,))
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        loss = ChunkedHeadLoss.apply(hidden, weight, None, targets, 8)
    assert max(saved) == 40 * 16
    loss.backward()
    again = hidden.detach().requires_grad_()
    reference = torch.nn.functional.cross_entropy(again @ weight.T, targets, reduction="sum")
    reference.backward()
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert torch.allclose(hidden.grad, again.grad, rtol=1e-4, atol=1e-5)


def test_a_trainable_head_takes_the_whole_head_path() -> None:
    """The chunked loss gives the LM head no gradient, so a head that trains is never chunked."""
    model, tok = _lora_model("llama", torch.float32)
    head = model.get_output_embeddings()
    head.weight.requires_grad_(True)
    batch = PaddingCollator(tok.pad_token_id)(_features(tok))
    completion_loss(model, batch, lm_head_chunk=5).backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def test_mask_dropout_keeps_a_bool_mask_and_drops_like_dropout() -> None:
    from simplan.training.lora import MaskDropout

    torch.manual_seed(0)
    x = torch.randn(400, 500, requires_grad=True)
    drop = MaskDropout(0.2)
    saved: list[torch.dtype] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        y = drop(x)
    assert saved == [torch.bool]  # F.dropout keeps a float32 noise tensor on the CPU
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(0.8, abs=0.01)
    assert torch.allclose(y[kept], x[kept] / 0.8)
    y.sum().backward()
    assert torch.equal(x.grad, kept.float() / 0.8)
    assert torch.equal(drop.eval()(x), x)


def test_training_models_get_mask_dropout_in_every_lora_layer() -> None:
    from simplan.training.config import LoraArguments, ModelArguments
    from simplan.training.lora import MaskDropout, load_model_for_training

    model, _ = load_model_for_training(
        ModelArguments(model=str(tiny_model("llama"))), LoraArguments(lora_dropout=0.1), False
    )
    dropouts = [d for m in model.modules() if hasattr(m, "lora_A") for d in m.lora_dropout.values()]
    assert dropouts and all(type(d) is MaskDropout and d.p == 0.1 for d in dropouts)


def test_train_with_bf16_weights_gives_the_same_first_loss_chunked_or_not(tmp_path) -> None:
    """Through the Trainer (accelerate runs the forward under autocast and hands float32 outputs back) with bf16
    base weights: the chunked head trains, and its first loss is the one-piece head's."""
    import json

    from datasets import Dataset, DatasetDict

    from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments
    from simplan.training.trainer import train

    rows = [{"messages": CONVERSATION[: 3 + 2 * k], "weights": [0, 0, 1, 0, 1, 0, 1][: 3 + 2 * k]} for k in range(3)]
    DatasetDict({"train": Dataset.from_list(rows * 4)}).save_to_disk(str(tmp_path / "data"))
    first = {}
    for chunk in (0, 5):
        out = tmp_path / f"run-{chunk}"
        train(
            ModelArguments(model=str(tiny_model("llama"))),
            LoraArguments(lora_r=4, lora_alpha=8, lora_dropout=0.0),
            DataArguments(dataset=str(tmp_path / "data"), eval_split=""),
            TrainArguments(
                output_dir=str(out),
                max_steps=2,
                per_device_train_batch_size=4,
                bf16="true",
                lm_head_chunk=chunk,
                logging_steps=1,
                save_steps=100,
                report_to="none",
                seed=0,
            ),
        )
        logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        first[chunk] = [r["loss"] for r in logs if "loss" in r][0]
    assert first[5] == pytest.approx(first[0], rel=1e-3)


def test_micro_batches_with_accumulation_give_the_loss_and_gradients_of_one_batch(tmp_path) -> None:
    """Micro-batch 1 x accumulation 4 is the optimizer step of batch 4 x 1 (the memory recipe of bench/RESULTS.md
    "Training throughput"): the Trainer divides each micro-batch's summed loss by the labelled tokens of the whole
    accumulated batch, so the logged losses, gradient norms and trained adapters agree. The windows have different
    numbers of labelled tokens, so a mean of per-micro-batch means would not agree."""
    import json

    from datasets import Dataset, DatasetDict
    from safetensors.torch import load_file

    from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments
    from simplan.training.trainer import train

    weights = [0, 0, 1, 0, 1, 0, 1]
    rows = []
    for j in range(12):  # every window a different length and label count, so each batch mixes them
        k, extra = j % 3, " now" * (j // 3)
        messages = [dict(m, content=m["content"] + extra) if m["role"] == "assistant" else m for m in CONVERSATION]
        rows.append({"messages": messages[: 3 + 2 * k], "weights": weights[: 3 + 2 * k]})
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "data"))
    runs = {}
    for micro, accumulation in ((4, 1), (2, 2), (1, 4)):
        out = tmp_path / f"run-{micro}x{accumulation}"
        train(
            ModelArguments(model=str(tiny_model("llama"))),
            LoraArguments(lora_r=4, lora_alpha=8, lora_dropout=0.0),
            DataArguments(dataset=str(tmp_path / "data"), eval_split=""),
            TrainArguments(
                output_dir=str(out),
                max_steps=3,
                learning_rate=1e-2,
                per_device_train_batch_size=micro,
                gradient_accumulation_steps=accumulation,
                bf16="false",
                logging_steps=1,
                save_steps=100,
                report_to="none",
                seed=0,
            ),
        )
        logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in logs if "loss" in r]
        adapter = load_file(str(out / "adapter" / "adapter_model.safetensors"))
        runs[micro] = ([r["loss"] for r in steps], [r["grad_norm"] for r in steps], adapter)
    loss, norm, adapter = runs[4]
    assert len(loss) == 3 and len(set(loss)) == 3  # three different steps, each logged
    for micro in (2, 1):
        assert runs[micro][0] == pytest.approx(loss, rel=1e-5)
        assert runs[micro][1] == pytest.approx(norm, rel=1e-4)
        for name, weight in adapter.items():
            assert torch.allclose(runs[micro][2][name], weight, rtol=1e-4, atol=1e-6), name


TRIM_PROBE = """
import json
from pathlib import Path
import torch
from simplan.core.memory import release_memory, set_mmap_threshold

set_mmap_threshold(64 << 20)  # 4 MB tensors on the heap, as glibc's own threshold puts them once it has grown
status = lambda: Path("/proc/self/status").read_text().splitlines()
rss = lambda: int(next(x for x in status() if x.startswith("VmRSS")).split()[1])
tensors, kept = [], []
for _ in range(200):  # 800 MB, each followed by a 64 kB tensor that stays: the 800 MB become holes free() keeps
    tensors.append(torch.ones(1 << 20))
    kept.append(torch.ones(1 << 14))
before = rss()
del tensors
freed = rss()
release_memory()
print(json.dumps([before, freed, rss()]))
"""


def test_release_memory_gives_glibcs_freed_heap_back() -> None:
    import subprocess
    import sys

    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux /proc")
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, check=True).stdout
    before, freed, released = json.loads(out)
    assert freed > before - 100_000  # kB: glibc kept the 800 MB after free()...
    assert released < before - 600_000  # ...and release_memory handed it back


MMAP_PROBE = """
import json
from pathlib import Path
import torch
from simplan.core.memory import mmap_threshold

status = lambda: Path("/proc/self/status").read_text().splitlines()
rss = lambda: int(next(x for x in status() if x.startswith("VmRSS")).split()[1])

def holes():  # 800 MB of 4 MB tensors, each followed by a 64 kB one that stays; kB resident before and after the free
    tensors, kept = [], []
    for _ in range(200):
        tensors.append(torch.ones(1 << 20))
        kept.append(torch.ones(1 << 14))
    before = rss()
    del tensors
    return [before, rss()], kept

with mmap_threshold(1 << 20):
    inside, kept1 = holes()
after, kept2 = holes()  # glibc's largest threshold (32 MiB): 4 MB blocks from the heap again
print(json.dumps([inside, after]))
"""


def test_an_mmap_threshold_gives_freed_blocks_back_at_once_and_is_lifted_after() -> None:
    import subprocess
    import sys

    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux /proc")
    out = subprocess.run([sys.executable, "-c", MMAP_PROBE], capture_output=True, text=True, check=True).stdout
    (before, freed), (before_after, freed_after) = json.loads(out)
    assert freed < before - 600_000  # kB: the 800 MB were their own maps, unmapped by free()
    assert freed_after > before_after - 100_000  # after the block they are heap again, kept by free()


def test_the_mmap_threshold_setting_is_checked() -> None:
    from simplan.training.config import TrainArguments

    with pytest.raises(ValueError, match="malloc_mmap_threshold"):
        TrainArguments(output_dir="x", malloc_mmap_threshold=-1)

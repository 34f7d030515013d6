"""Prompt fitting for the planner: keep prompts within the token budget without tokenizing each one.

    fitter = PromptFitter(locked(chat_token_counter(tokenizer)), budget=1024, tokenizer=tokenizer)
    state = fitter.fit(state, decider_messages)       # data/format.fit_to_budget, only when needed

`approx_token_counter` stands in when an engine exposes no tokenizer; `locked` serialises a token
counter on the tokenizer lock that episodes running in threads share.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from simplan.data.format import Messages, PromptState, fit_to_budget


def approx_token_counter(messages: Messages) -> int:
    """~4 characters per token plus a few per message: used when the engine exposes no tokenizer."""
    return sum(len(m.get("content", "")) // 4 + 4 for m in messages)


_TOKENIZER_LOCK = threading.RLock()
_FITTER_CACHES: weakref.WeakKeyDictionary[Any, tuple[dict[str, int], dict[tuple[str, ...], int]]] = (
    weakref.WeakKeyDictionary()
)


class PromptFitter:
    """Fits prompt states to the token budget (data/format.fit_to_budget) without tokenizing every prompt.

    Exact counting renders the chat template and tokenizes the whole prompt, which costs more than
    anything else the loop does. With a tokenizer, a prompt is first bounded from above by the
    template's own tokens plus the cached token counts of its lines plus one token per newline
    and a small slack (tokenizers pre-split text at newlines, so lines do not merge); only a prompt
    whose bound exceeds the budget is counted exactly and trimmed.
    """

    SLACK = 8
    MAX_CACHE = 100_000

    def __init__(self, count_tokens: Callable[[Messages], int], budget: int, tokenizer: Any = None) -> None:
        self.count_tokens, self.budget, self.tokenizer = count_tokens, budget, tokenizer
        # Line counts depend only on the tokenizer: share them between the planners of one process.
        caches = _FITTER_CACHES.setdefault(tokenizer, ({}, {})) if tokenizer is not None else ({}, {})
        self._lines: dict[str, int] = caches[0]
        self._scaffold: dict[tuple[str, ...], int] = caches[1]
        self.exact_counts = 0  # prompts that needed the exact path (for benchmarks)

    def fit(self, state: PromptState, render: Callable[[PromptState], Messages]) -> PromptState:
        if self.tokenizer is not None and self.upper_bound(render(state)) <= self.budget:
            return state
        self.exact_counts += 1
        fitted, _ = fit_to_budget(state, render, self.count_tokens, self.budget)
        return fitted

    def upper_bound(self, messages: Messages) -> int:
        roles = tuple(m["role"] for m in messages)
        scaffold = self._scaffold.get(roles)
        if scaffold is None:
            scaffold = self._scaffold[roles] = self.count_tokens([{"role": r, "content": ""} for r in roles])
        lines = [line for m in messages for line in m["content"].split("\n")]
        counts = {line: self._lines.get(line) for line in set(lines)}  # local: other threads may clear the cache
        new = [line for line, c in counts.items() if c is None]
        if new:
            with _TOKENIZER_LOCK:  # HF fast tokenizers can fail ("Already borrowed") when called concurrently
                ids = self.tokenizer(new, add_special_tokens=False)["input_ids"]
            fresh = dict(zip(new, map(len, ids)))
            counts.update(fresh)
            if len(self._lines) > self.MAX_CACHE:
                self._lines.clear()
            self._lines.update(fresh)
        return scaffold + sum(counts[line] for line in lines) + len(lines) + self.SLACK  # type: ignore[misc]


def locked(count: Callable[[Messages], int]) -> Callable[[Messages], int]:
    """A token counter that holds the shared tokenizer lock (episodes may run in threads)."""

    def count_locked(messages: Messages) -> int:
        with _TOKENIZER_LOCK:
            return count(messages)

    return count_locked

"""The hf backend's prefix cache: per live session and adapter, the KV cache of the session's latest prompt.

    from simplan.inference.engines.prefix_cache import PrefixCache, Prefix, common_prefix, crop
    cache = PrefixCache(sessions=16)
    prefix = cache.take("episode-1", "decider")            # removed while the caller extends it
    if prefix is not None:
        crop(prefix.kv, common_prefix(prefix.tokens, ids))  # keep what the new prompt shares
    cache.put("episode-1", "decider", Prefix(ids, kv))     # least-recently used sessions evicted

How inference/engines/hf_peft.py prefills from it, under batching too, is in that module's docstring.
Only a model whose DynamicCache is made of plain full-attention layers can be cropped and stacked
(`plain_dynamic_cache`); others run without the cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class Prefix:
    tokens: list[int]  # the prompt tokens whose keys and values `kv` holds
    kv: Any  # transformers DynamicCache of batch size 1


class PrefixCache:
    """Per session and adapter, the KV cache of the session's latest prompt; least-recently used sessions
    are evicted beyond `sessions`. Thread-safe (episode threads end sessions while a batching thread runs)."""

    def __init__(self, sessions: int) -> None:
        self.sessions = sessions
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, dict[str | None, Prefix]] = OrderedDict()

    def take(self, session: str, adapter: str | None) -> Prefix | None:
        """Remove and return the session's prefix for `adapter`: the caller extends its cache in place and
        `put`s it back, so no other call can see it half-updated."""
        with self._lock:
            entry = self._entries.get(session)
            return entry.pop(adapter, None) if entry is not None else None

    def put(self, session: str, adapter: str | None, prefix: Prefix) -> None:
        with self._lock:
            self._entries.setdefault(session, {})[adapter] = prefix
            self._entries.move_to_end(session)
            while len(self._entries) > self.sessions:
                self._entries.popitem(last=False)

    def end(self, session: str) -> None:
        with self._lock:
            self._entries.pop(session, None)

    def tokens(self, session: str) -> dict[str | None, int]:
        """Cached prompt tokens per adapter of `session` (empty when it holds nothing)."""
        with self._lock:
            return {a: len(p.tokens) for a, p in self._entries.get(session, {}).items()}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def crop(kv: Any, length: int) -> None:
    """Cut a DynamicCache to its first `length` tokens (Cache.crop takes the number to remove)."""
    extra = kv.get_seq_length() - length
    if extra > 0:
        kv.crop(-extra)


def plain_dynamic_cache(config: Any) -> bool:
    """Whether the model's DynamicCache is made of plain full-attention layers, the only ones the prefix cache
    crops and stacks (sliding-window or linear-attention layers keep states it cannot cut back)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)

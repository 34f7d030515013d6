"""A KV cache that decodes without copying itself: keys and values live in a preallocated buffer with spare room.

    from simplan.inference.engines.kv_cache import growing_cache
    cache = growing_cache(layers=30, spare=max_new_tokens)
    model.generate(input_ids=ids, past_key_values=cache, ...)

transformers' `DynamicLayer.update` concatenates every new token onto the layer's whole keys and values
(`torch.cat`): each decoded token re-allocates and copies all 30 layers' caches, O(prompt length) per token
(22% of the hf engine's evaluation time on ~2-3k-token prompts, and page faults under concurrency).
`GrowingLayer` writes new states into a buffer `[batch, heads, capacity, head_dim]` instead and exposes
`keys`/`values` as views of its filled part; when the buffer is full it is re-allocated with `spare` more
tokens of room than needed. With `spare` = the request's max_new_tokens, a generate call allocates once at
prefill and never copies again.

Everything else is DynamicLayer's: `crop` slices the views (the buffer stays and the next update writes over
the cropped tail), `get_seq_length`/`get_mask_sizes` read the views' length. Methods that rebind `keys` to a
new tensor (`batch_repeat_interleave`, `batch_select_indices`, `reorder_cache`, `offload`) leave the layer
holding a tensor that is not a view of its buffer: `update` detects that (storage pointer, shape and strides)
and re-buffers from the new tensor, so it never writes into a stale buffer.

Views share the buffer: a view taken before a `crop` sees later updates overwrite its tail. Copy what must
outlive a crop (the hf engine's `_stacked_prefill` copies each row as soon as it is prefilled).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

CHUNK = 64  # default spare tokens: room for a few decode steps or a scoring trie without re-allocating


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of a buffer with `spare` tokens of room to grow."""

    def __init__(self, spare: int = CHUNK) -> None:
        if spare < 0:
            raise ValueError(f"GrowingLayer.spare: must be >= 0 tokens, got {spare}")
        super().__init__()
        self.spare = spare
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, length: int, spare: int = CHUNK) -> GrowingLayer:
        """A layer that adopts `keys`/`values` as its buffers, the first `length` tokens filled (no copy)."""
        layer = cls(spare)
        layer.lazy_initialization(keys, values)
        layer._key_buffer, layer._value_buffer = keys, values
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
        return layer

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new states after the filled part (re-buffering with `spare` more room when they do not fit,
        or when `keys` was rebound away from the buffer) and return views of everything filled."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, new = self.get_seq_length(), key_states.shape[-2]
        fits = self._owns_views() and start + new <= self._key_buffer.shape[-2]
        if not fits or self._key_buffer.shape[0] != key_states.shape[0]:
            self._rebuffer(key_states, value_states, start + new + self.spare)
        self._key_buffer[:, :, start : start + new] = key_states
        self._value_buffer[:, :, start : start + new] = value_states
        self.keys = self._key_buffer[:, :, : start + new]
        self.values = self._value_buffer[:, :, : start + new]
        return self.keys, self.values

    def trim(self, spare: int) -> None:
        """Re-allocate the buffer when it holds more than `spare` free tokens (a cache kept for reuse after a
        long prompt was cropped short should not keep the long prompt's memory)."""
        filled = self.get_seq_length()
        if filled and self._owns_views() and self._key_buffer.shape[-2] - filled > spare:
            self._rebuffer(self.keys, self.values, filled + spare)

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        super().reset()

    def capacity(self) -> int:
        """Tokens the buffer holds room for (0 before the first update)."""
        return 0 if self._key_buffer is None else self._key_buffer.shape[-2]

    def _owns_views(self) -> bool:
        """Whether `keys`/`values` are still leading views of this layer's buffers (crop keeps them so; methods
        that rebind them to new tensors do not)."""
        return _leading_view(self.keys, self._key_buffer) and _leading_view(self.values, self._value_buffer)

    def _rebuffer(self, like_keys: torch.Tensor, like_values: torch.Tensor, capacity: int) -> None:
        """New buffers of `capacity` tokens (batch, heads, head_dim, dtype and device of `like_*`) holding the
        layer's current keys and values."""
        filled = self.get_seq_length()
        self._key_buffer = like_keys.new_empty((*like_keys.shape[:2], capacity, like_keys.shape[3]))
        self._value_buffer = like_values.new_empty((*like_values.shape[:2], capacity, like_values.shape[3]))
        if filled:
            self._key_buffer[:, :, :filled] = self.keys
            self._value_buffer[:, :, :filled] = self.values
        self.keys = self._key_buffer[:, :, :filled]
        self.values = self._value_buffer[:, :, :filled]


def _leading_view(view: torch.Tensor | None, buffer: torch.Tensor | None) -> bool:
    """`view` is `buffer[:, :, :n]` for some n (same storage start, batch, heads, head_dim and strides)."""
    if view is None or buffer is None or view.dim() != 4:
        return False
    return (
        view.data_ptr() == buffer.data_ptr()
        and view.shape[:2] == buffer.shape[:2]
        and view.shape[3] == buffer.shape[3]
        and view.shape[2] <= buffer.shape[2]
        and view.stride() == buffer.stride()
    )


def growing_cache(layers: int, spare: int = CHUNK) -> DynamicCache:
    """An empty DynamicCache of `layers` GrowingLayers (pass it to `generate` as `past_key_values`)."""
    cache = DynamicCache()
    cache.layers = [GrowingLayer(spare) for _ in range(layers)]
    cache.layer_class_to_replicate = None
    return cache


def stacked_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], length: int, spare: int) -> DynamicCache:
    """A DynamicCache of GrowingLayers adopting per-layer (keys, values) buffers whose first `length` tokens are
    filled (the rest is room to decode into)."""
    cache = growing_cache(0, spare)
    cache.layers = [GrowingLayer.holding(k, v, length, spare) for k, v in layers]
    return cache

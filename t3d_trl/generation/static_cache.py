"""A preallocated key/value cache written at fixed canvas positions.

Every decoding mode keeps its keys and values in one buffer per layer that covers the whole canvas (prompt plus
generated region), ``[B, kv_heads, T, head_dim]``. A forward pass writes its keys/values at the canvas position
held in ``write_at`` (a tensor, so a compiled step does not specialise on it) and attends to the whole buffer;
the attention mask hides what a query must not see (later blocks, padding, stale entries). The shapes of a
step therefore depend only on its number of queries, never on how far decoding has got, which is what lets
``torch.compile`` (and CUDA graphs) reuse one compiled step for a whole generation.
"""

from __future__ import annotations

import torch
from transformers import Cache
from transformers.cache_utils import CacheLayerMixin


class StaticLayer(CacheLayerMixin):
    """One layer's preallocated keys/values; ``update`` writes at ``write_at`` and returns the whole buffer."""

    is_compileable = True
    is_sliding = False

    def __init__(self, length: int, write_at: torch.Tensor):
        super().__init__()
        self.length = length
        self.write_at = write_at

    def allocate(
        self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (batch, heads, self.length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, head_dim = key_states.shape
        self.allocate(batch, heads, head_dim, key_states.dtype, key_states.device)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        index = self.write_at + torch.arange(key_states.shape[-2], device=key_states.device)
        # In place: the buffers keep their address, as CUDA graphs need.
        self.keys.index_copy_(2, index, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, index, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.length


class StaticKVCache(Cache):
    """Keys/values of the whole canvas for every layer, written where ``write_at`` says.

    Args:
        config: the model's config (layer count, key/value heads and head size, read when present; otherwise a
            layer is allocated on its first write).
        batch: rows of the canvas.
        length: canvas length ``T``.
        dtype, device: the model's compute dtype and device.
    """

    def __init__(self, config, batch: int, length: int, dtype: torch.dtype, device: torch.device | str):
        self.write_at = torch.zeros((), dtype=torch.long, device=device)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_layers = config.num_hidden_layers
        super().__init__(layers=[StaticLayer(length, self.write_at) for _ in range(num_layers)])
        heads = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None)
        head_dim = getattr(config, "head_dim", None)
        if head_dim is None and heads is not None:
            head_dim = config.hidden_size // config.num_attention_heads
        if heads is not None and head_dim is not None:
            for layer in self.layers:
                layer.allocate(batch, heads, head_dim, dtype, torch.device(device))

    def write_window_at(self, start: int) -> None:
        """Make the next forward pass write its keys/values at canvas position ``start``."""
        self.write_at.fill_(start)

    def mark_static(self) -> None:
        """Tell ``torch.compile`` that the buffers never move (CUDA graphs then read them in place)."""
        for layer in self.layers:
            if layer.is_initialized:
                torch._dynamo.mark_static_address(layer.keys)
                torch._dynamo.mark_static_address(layer.values)
        torch._dynamo.mark_static_address(self.write_at)

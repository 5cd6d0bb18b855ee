"""A preallocated key/value cache written at explicit positions (gpt-fast's static cache).

Notation: L layers, B batch, Hkv key/value heads, S_max capacity in positions, D head dim.

The cache is an object of its own, passed to the model on each call, so one set of weights can serve
many generations at once: the model holds no per-request state.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,  # None: torch's default device
    ) -> None:
        if min(n_layers, batch, n_kv_heads, max_len, head_dim) <= 0:
            raise ValueError("every KV cache size (layers, batch, heads, length, head_dim) must be positive.")
        self.max_len = max_len
        shape = (batch, n_kv_heads, max_len, head_dim)
        # One (B, Hkv, S_max, D) pair per layer, allocated once; decoding writes into them in place.
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = 0  # positions filled so far (the same for every layer once a forward has finished)

    @classmethod
    def for_model(cls, config, batch: int, max_len: int | None = None, *, dtype=torch.float32, device=None):
        max_len = config.max_seq_len if max_len is None else max_len
        if max_len > config.max_seq_len:
            raise ValueError(
                f"the cache holds at most the model's context of {config.max_seq_len} positions, asked for {max_len}."
            )
        return cls(config.n_layers, batch, config.n_kv_heads, max_len, config.head_dim, dtype=dtype, device=device)

    def update(self, layer: int, start_pos: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, Hkv, T, D) at positions [start_pos, start_pos + T); return the filled views
        (B, Hkv, start_pos + T, D) of this layer's cache."""
        end = start_pos + k.shape[2]
        if start_pos < 0 or end > self.max_len:
            raise ValueError(
                f"positions {start_pos}..{end - 1} do not fit a KV cache of {self.max_len} positions: "
                "generate fewer tokens or make a larger cache."
            )
        self.k[layer][:, :, start_pos:end].copy_(k)
        self.v[layer][:, :, start_pos:end].copy_(v)
        if layer == len(self.k) - 1:
            self.length = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values of all layers."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def bytes_per_layer(self) -> int:
        return self.nbytes // self.n_layers

    @property
    def bytes_used(self) -> int:
        """Bytes holding filled positions, all layers."""
        return self.nbytes * self.length // self.max_len

    def reset(self) -> None:
        """Forget every position (the memory stays allocated)."""
        for t in self.k + self.v:
            t.zero_()
        self.length = 0

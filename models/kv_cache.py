"""A preallocated key/value cache written at explicit positions (gpt-fast's static cache).

Notation: L layers, B batch, Hkv key/value heads, S_max capacity in positions, D head dim, W a local layer's window.

The cache is an object of its own, passed to the model on each call, so one set of weights can serve
many generations at once: the model holds no per-request state.

A sliding-window layer (Mistral, Gemma 3's local layers) never looks further back than its window, so its cache
keeps only the last W positions: a ring of W slots, position p in slot p % W, written over as the text grows.
In Gemma 3, five layers in six are local: they hold W positions each at any length, only the sixth holds them all.
A window as long as the cache (W >= S_max) never wraps and is stored like a global layer.
"""
from __future__ import annotations

from typing import Sequence

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
        windows: Sequence[int | None] | None = None,  # per layer: its sliding window, or None (global)
    ) -> None:
        if min(n_layers, batch, n_kv_heads, max_len, head_dim) <= 0:
            raise ValueError("every KV cache size (layers, batch, heads, length, head_dim) must be positive.")
        windows = [None] * n_layers if windows is None else list(windows)
        if len(windows) != n_layers or any(w is not None and w <= 0 for w in windows):
            raise ValueError(f"windows must give each of the {n_layers} layers a positive window or None.")
        self.max_len = max_len
        # Positions each layer stores: all of them (S_max), or a local layer's last W.
        self.capacity = [max_len if w is None else min(w, max_len) for w in windows]
        # One (B, Hkv, S_max or W, D) pair per layer, allocated once; decoding writes into them in place.
        self.k = [torch.zeros((batch, n_kv_heads, n, head_dim), dtype=dtype, device=device) for n in self.capacity]
        self.v = [torch.zeros((batch, n_kv_heads, n, head_dim), dtype=dtype, device=device) for n in self.capacity]
        self.length = 0  # positions filled so far (the same for every layer once a forward has finished)
        self.written = [0] * n_layers  # a ring layer's positions written so far (what it can still give back)

    @classmethod
    def for_model(cls, config, batch: int, max_len: int | None = None, *, dtype=torch.float32, device=None):
        max_len = config.max_seq_len if max_len is None else max_len
        if max_len > config.max_seq_len:
            raise ValueError(
                f"the cache holds at most the model's context of {config.max_seq_len} positions, asked for {max_len}."
            )
        return cls(config.n_layers, batch, config.n_kv_heads, max_len, config.head_dim, dtype=dtype, device=device,
                   windows=[config.layer_window(i) for i in range(config.n_layers)])

    def update(self, layer: int, start_pos: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, Hkv, T, D) at positions [start_pos, start_pos + T); return the filled views
        (B, Hkv, start_pos + T, D) of this layer's cache (a ring layer: see ``_update_ring``)."""
        end = start_pos + k.shape[2]
        if start_pos < 0 or end > self.max_len:
            raise ValueError(
                f"positions {start_pos}..{end - 1} do not fit a KV cache of {self.max_len} positions: "
                "generate fewer tokens or make a larger cache."
            )
        if self.capacity[layer] < self.max_len:
            return self._update_ring(layer, start_pos, k, v)
        self.k[layer][:, :, start_pos:end].copy_(k)
        self.v[layer][:, :, start_pos:end].copy_(v)
        if layer == len(self.k) - 1:
            self.length = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def _update_ring(self, layer: int, start_pos: int, k: torch.Tensor, v: torch.Tensor):
        """A local layer of window W: return the keys and values of positions [start_pos - W + 1, start_pos + T)
        in order (what the first new query can see, through the last new one), each (B, Hkv, <= W - 1 + T, D),
        then keep the last W of them in the ring. The attention's mask keeps each query to its own window."""
        W, T, written = self.capacity[layer], k.shape[2], self.written[layer]
        first = max(0, start_pos - W + 1)  # the oldest position a new query can see
        if start_pos > written or first < written - W:
            raise ValueError(f"layer {layer} keeps only its last {W} positions and has positions up to {written - 1}: "
                             f"it cannot continue at position {start_pos}. Start a new cache.")
        old = torch.arange(first, start_pos, device=k.device) % W  # (start_pos - first,) slots, oldest first
        keys = torch.cat((self.k[layer][:, :, old], k), dim=2)  # (B, Hkv, start_pos - first + T, D)
        values = torch.cat((self.v[layer][:, :, old], v), dim=2)
        keep = min(T, W)
        new = torch.arange(start_pos + T - keep, start_pos + T, device=k.device) % W  # (keep,) slots to write
        self.k[layer][:, :, new] = k[:, :, T - keep:]
        self.v[layer][:, :, new] = v[:, :, T - keep:]
        self.written[layer] = start_pos + T
        if layer == len(self.k) - 1:
            self.length = start_pos + T
        return keys, values

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
        """Bytes holding filled positions, all layers (a ring layer holds at most its window)."""
        return sum((k.nbytes + v.nbytes) * min(self.length, n) // n
                   for k, v, n in zip(self.k, self.v, self.capacity))

    def reset(self) -> None:
        """Forget every position (the memory stays allocated)."""
        for t in self.k + self.v:
            t.zero_()
        self.length = 0
        self.written = [0] * self.n_layers

"""One shared, bounded, evicting cache for computed views: the place large results live instead of ``gr.State``.

Every session that asks the same question of the same weights gets the same answer, so a result is keyed by
what computed it: the model's identity and weights version (``weights_key``), the view's name and its inputs.
A class of 40 opening the page at once then runs each opening example once (later callers of a key being
computed wait for that one computation instead of starting their own), and a user's own model, changed in
place by LoRA, never meets a stale entry (its weights key changes with every in-place write).

The cache is bounded in bytes and entries (least recently used out first), so no sequence of requests makes
it grow past ``EXPLORER_RESULT_CACHE`` (default 512 MiB). Cached values are shared by every caller: treat
them as read-only.

    results.get_or_compute(("attention", weights_key(model), tuple(ids), causal), compute)
"""
from __future__ import annotations

import itertools
import sys
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import torch

from .sizes import bytes_setting

DEFAULT_CACHE_BYTES = 512 * 2**20
DEFAULT_CACHE_ENTRIES = 512

_model_ids: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()
_model_ids_guard = threading.Lock()
_next_id = itertools.count(1)


def model_id(model: torch.nn.Module) -> int:
    """A number for this model object, never reused by another object (unlike ``id()``)."""
    with _model_ids_guard:
        number = _model_ids.get(model)
        if number is None:
            number = _model_ids[model] = next(_next_id)
        return number


def weights_key(model: torch.nn.Module) -> tuple:
    """Changes whenever a weight of ``model`` does: LoRA attached or detached (new tensors), trained or merged
    (in-place writes bump a tensor's version counter). Reads no tensor values."""
    version = tuple((t.data_ptr(), t._version) for t in itertools.chain(model.parameters(), model.buffers()))
    return (model_id(model), hash(version))


def approx_bytes(value: Any, _depth: int = 0) -> int:
    """Rough bytes a cached value holds: arrays and tensors exactly, containers summed, Plotly figures by their
    traces' arrays, anything else by ``sys.getsizeof``."""
    if _depth > 6:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(approx_bytes(k, _depth + 1) + approx_bytes(v, _depth + 1) for k, v in value.items()) + 64
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(approx_bytes(v, _depth + 1) for v in value) + 8 * len(value) + 56
    data = getattr(value, "data", None)
    if data is not None and hasattr(value, "layout") and isinstance(data, tuple):  # a plotly Figure
        return sum(approx_bytes(trace.to_plotly_json(), _depth + 1) for trace in data) + 4096
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return approx_bytes(vars(value), _depth + 1)
    return sys.getsizeof(value)


class ResultCache:
    """Least-recently-used results under a byte and an entry bound, computed once per key at a time."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._used: dict[Any, float] = {}  # key -> when it was last read or written (monotonic s)
        self._pending: dict[Any, threading.Event] = {}
        self._bytes = 0
        self._guard = threading.Lock()  # held only to read or write the dicts: never while computing
        self.hits = self.misses = 0

    def get(self, key: Any, default: Any = None) -> Any:
        with self._guard:
            if key in self._entries:
                self._entries.move_to_end(key)
                self._used[key] = time.monotonic()
                self.hits += 1
                return self._entries[key][0]
        return default

    def put(self, key: Any, value: Any, nbytes: int | Callable[[Any], int] | None = None) -> None:
        """Keep ``value`` under ``key``; its size is ``nbytes`` (a number, or a function of the value), else
        ``approx_bytes(value)``."""
        size = approx_bytes(value) if nbytes is None else int(nbytes(value) if callable(nbytes) else nbytes)
        with self._guard:
            if key in self._entries:
                self._bytes -= self._entries.pop(key)[1]
            if size > self.max_bytes:  # larger than the whole cache: serve it, keep nothing
                return
            self._entries[key] = (value, size)
            self._used[key] = time.monotonic()
            self._bytes += size
            while self._entries and (self._bytes > self.max_bytes or len(self._entries) > self.max_entries):
                old, (_, dropped) = self._entries.popitem(last=False)
                self._used.pop(old, None)
                self._bytes -= dropped

    def get_or_compute(self, key: Any, compute: Callable[[], Any],
                       nbytes: int | Callable[[Any], int] | None = None) -> Any:
        """The cached value for ``key``, or ``compute()`` stored under it. While one caller computes a key, the
        others asking for it wait for that result (if it fails, each computes for itself)."""
        while True:
            with self._guard:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    self._used[key] = time.monotonic()
                    self.hits += 1
                    return self._entries[key][0]
                waiting = self._pending.get(key)
                if waiting is None:
                    self._pending[key] = threading.Event()
                    self.misses += 1
                    break
            if not waiting.wait(timeout=120):  # the computing caller hung: compute without it
                return compute()
            with self._guard:
                if key in self._entries or key in self._pending:
                    continue
            return compute()  # the computing caller failed: its error is its own, try once here
        try:
            value = compute()
            self.put(key, value, nbytes)
            return value
        finally:
            with self._guard:
                self._pending.pop(key).set()

    def contains(self, key: Any) -> bool:
        """Whether ``key`` is kept now (without counting a read)."""
        with self._guard:
            return key in self._entries

    def count_where(self, match: Callable[[Any], bool]) -> int:
        with self._guard:
            return sum(1 for k in self._entries if match(k))

    def drop_where(self, match: Callable[[Any], bool], keep: int = 0) -> int:
        """Forget the entries whose key ``match`` accepts but the ``keep`` most recently used (one kind of result
        bounded on its own: the Training tab's snapshots); how many were dropped."""
        with self._guard:
            matching = [k for k in self._entries if match(k)]  # least recently used first
            old = matching[:max(len(matching) - keep, 0)]
            for k in old:
                self._bytes -= self._entries.pop(k)[1]
                self._used.pop(k, None)
        return len(old)

    def clear(self) -> None:
        with self._guard:
            self._entries.clear()
            self._used.clear()
            self._bytes = 0

    def drop_unused(self, seconds: float, keep: Callable[[Any], bool] = lambda key: False) -> int:
        """Forget every entry nobody has read for ``seconds`` (except keys ``keep`` says to keep): a class's
        per-prompt results go when the class has gone. How many were dropped."""
        now = time.monotonic()
        with self._guard:
            old = [k for k in self._entries if now - self._used.get(k, now) > seconds and not keep(k)]
            for k in old:
                self._bytes -= self._entries.pop(k)[1]
                self._used.pop(k, None)
        return len(old)

    def stats(self) -> dict[str, int]:
        with self._guard:
            return {"entries": len(self._entries), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses}


def _cache_bytes() -> int:
    return bytes_setting("EXPLORER_RESULT_CACHE", DEFAULT_CACHE_BYTES)


#: The one cache every panel uses.
results = ResultCache(_cache_bytes())

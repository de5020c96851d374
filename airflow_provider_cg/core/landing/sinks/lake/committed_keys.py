"""Which origin keys a lake table committed: its protocol log's index of key ranges, and the key
files it names (sorted ``origin_seq`` arrays, or runs for folded commits), read through a small
cache. ``CommittedKeys.masks`` tells a batch's duplicates; ``without`` drops them."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.landing.sinks.lake.protocol_log import (
    CommitLog,
    in_runs,
    is_runs_file,
    npy_load,
)
from airflow_provider_cg.core.landing.sinks.lake.storage import Storage
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import isin_sorted


class CommittedKeys:
    """The committed keys of the table in ``store`` as ``log`` lists them."""

    def __init__(self, store: Storage, log: CommitLog, cache_size: int = 16) -> None:
        self.store, self.log, self.cache_size = store, log, cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def masks(self, keys: dict[str, np.ndarray], after_pos: int) -> dict[str, np.ndarray]:
        """For each stream with duplicates: mask over its sorted keys of those already committed.
        A key file clean-up removed (folded since this log was read) makes it read the log again."""
        for _ in range(5):
            try:
                return self._masks_once(keys, after_pos)
            except FileNotFoundError:
                self.log.reload_listed()
                after_pos = 0
        return self._masks_once(keys, 0)

    def _masks_once(self, keys: dict[str, np.ndarray], after_pos: int) -> dict[str, np.ndarray]:
        out = {}
        for stream, seqs in keys.items():
            index = self.log.index.get(stream)
            if index is None or len(seqs) == 0:
                continue
            mask = None
            for key_path in index.overlapping(int(seqs[0]), int(seqs[-1]), after_pos):
                committed = self.load(key_path)
                if is_runs_file(key_path):  # the folded commits' keys, as runs
                    part = in_runs(seqs, committed)
                    if part.any():
                        mask = part if mask is None else mask | part
                    continue
                lo = int(np.searchsorted(seqs, committed[0], side="left"))
                hi = int(np.searchsorted(seqs, committed[-1], side="right"))
                if lo >= hi:
                    continue
                part = isin_sorted(seqs[lo:hi], committed)
                if part.any():
                    if mask is None:
                        mask = np.zeros(len(seqs), dtype=bool)
                    mask[lo:hi] |= part
            if mask is not None:
                out[stream] = mask
        return out

    def load(self, rel: str) -> np.ndarray:
        """The keys of one key file (cached: the newest few are read again and again)."""
        arr = self._cache.get(rel)
        if arr is None:
            arr = npy_load(self.store.read(rel))
            self._cache[rel] = arr
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(rel)
        return arr


def without(
    table: pa.Table, keys: dict[str, np.ndarray], masks: dict[str, np.ndarray]
) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """Drop the rows whose key is masked in ``masks`` (per stream, over its sorted ``keys``)."""
    streams = table.column("origin_stream")
    seqs = table.column("origin_seq").to_numpy()
    single = len(keys) == 1
    drop = np.zeros(table.num_rows, dtype=bool)
    for stream, mask in masks.items():
        hit = isin_sorted(seqs, keys[stream][mask])
        if not single:
            hit &= pc.equal(streams, stream).to_numpy(zero_copy_only=False)
        drop |= hit
    left = {}
    for stream, sorted_keys in keys.items():
        rest = sorted_keys[~masks[stream]] if stream in masks else sorted_keys
        if len(rest):
            left[stream] = rest
    return table.filter(pa.array(~drop)), left

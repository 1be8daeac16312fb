"""When a prefilled prompt enters the radix tree (`cluster.scheduler.chunk_insertion`), one class per mode.

`whole`: the whole prompt is inserted (and its KV taken) when its batch is formed. `per_chunk` (needs
exact budgets): a batch allocates only what its step computes, and when the step ends each prompt goes
into the tree as far as computed, its lock moved there (SGLang's `cache_unfinished_req`).
docs/ALGORITHMS.md §7 has the reasoning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from repro.kvcache.keys import TOKEN_BYTES, key_prefix, key_slice
from repro.sim.scheduler_config import SchedulerConfig

if TYPE_CHECKING:  # pragma: no cover
    from repro.sim.prefill_adder import SglangPrefillAdder
    from repro.sim.worker import SimWorker


class WholePromptInsertion:
    """`whole`: prompts enter the tree at admission; a chunked prompt's uncomputed rest is in the tree
    (so it is `pending`: matches must stop where it is not computed yet)."""

    def __init__(self, worker: "SimWorker"):
        self.w = worker

    # --- SGLang's admission arithmetic (SglangPrefillAdder)
    @staticmethod
    def continuing_chunk(n: int, rest: int, out: int) -> tuple[int, int]:
        """(SGLang's reservation beyond our tree and reservations, KV allocated now) of the chunked
        request's next chunk of `n` of its `rest` tokens: our tree already holds the rest."""
        return n + 1 + (out if n == rest else 0) - rest - out, 0

    @staticmethod
    def allocated_tokens(new: int, rem_chunk: int) -> int:
        """New tokens an admitted request allocates when its batch is formed: all of them."""
        return new

    def allocate(self, admitted: list[int], phys: int) -> None:
        """After eviction made room: insert and lock the admitted prompts, reserve their outputs."""
        w = self.w
        t = w.table
        cache = w.cache
        for i in admitted:
            ins = cache.insert(t.prompt_key[i])
            cache.inc_lock_ref(ins.last_node)
            cache.dec_lock_ref(t.lock_node[i])
            t.lock_node[i] = ins.last_node
            w.reserved_tokens += t.output_len[i]
        w.tree_version += 1

    def continuing_chunk_alone(self, adder: "SglangPrefillAdder") -> None:
        """A pass with only the chunked request's next chunk: its KV is held already."""

    # --- the end of a prefill step
    def begin_prefill_end(self) -> None:
        pass

    def cache_computed(self, i: int, prefilled: int) -> None:
        """Request i's prompt is in the tree already."""

    def pending_after_step(self, chunked: int) -> list[tuple[bytes, int]]:
        if chunked < 0:
            return []
        t = self.w.table
        return [(t.prompt_key[chunked], t.compute_start[chunked] + t.prefilled[chunked])]


class PerChunkInsertion:
    """`per_chunk`: between steps the tree holds what SGLang's holds: a chunked prompt's uncomputed rest
    is neither cached nor allocated, and nodes split at chunk boundaries."""

    def __init__(self, worker: "SimWorker"):
        self.w = worker
        insert_after = getattr(worker.cache, "insert_after", None)  # RadixCache's walk-free verb
        self._insert_after: Any = insert_after
        self.cache_computed = self._insert_below_lock if insert_after is not None else self._insert_prefix

    @staticmethod
    def continuing_chunk(n: int, rest: int, out: int) -> tuple[int, int]:
        """Our tree holds what SGLang's does; the chunk is allocated now."""
        return n + 1 + (out if n == rest else 0) - out, n

    @staticmethod
    def allocated_tokens(new: int, rem_chunk: int) -> int:
        """Only the first chunk is allocated when the batch is formed."""
        return new if new <= rem_chunk else rem_chunk

    def allocate(self, admitted: list[int], phys: int) -> None:
        """The prompts stay outside the tree, as allocated KV (`alloc_tokens`), until their step ends."""
        w = self.w
        out = w.table.output_len
        outs = 0
        for i in admitted:
            outs += out[i]
        w.reserved_tokens += outs
        w.alloc_tokens = phys - outs

    @staticmethod
    def continuing_chunk_alone(adder: "SglangPrefillAdder") -> None:
        """A pass with only the chunked request's next chunk: allocate it."""
        adder.commit([])

    def begin_prefill_end(self) -> None:
        w = self.w
        w.alloc_tokens = 0
        w.tree_version += 1

    def _insert_prefix(self, i: int, prefilled: int) -> None:
        """The computed prefix into the tree, the lock moved to its end."""
        w = self.w
        t = w.table
        cache = w.cache
        key = t.prompt_key[i]
        end = t.compute_start[i] + prefilled
        lock = t.lock_node[i]
        ins = cache.insert(key if end * TOKEN_BYTES == len(key) else key_prefix(key, end))
        cache.inc_lock_ref(ins.last_node)
        cache.dec_lock_ref(lock)
        t.lock_node[i] = ins.last_node

    def _insert_below_lock(self, i: int, prefilled: int) -> None:
        """As _insert_prefix, inserting below the locked prefix: only the new chunk's tokens."""
        w = self.w
        t = w.table
        cache = w.cache
        lock: Any = t.lock_node[i]
        start = t.compute_start[i]
        # a first chunk (its lock is the matched prefix) counts as SGLang's inserted_len 0 (lfu / slru hits)
        ins = self._insert_after(
            lock, key_slice(t.prompt_key[i], lock.depth, start + prefilled), 0 if lock.depth <= start else None
        )
        cache.inc_lock_ref(ins.last_node)
        cache.dec_lock_ref(lock)
        t.lock_node[i] = ins.last_node

    @staticmethod
    def pending_after_step(chunked: int) -> list[tuple[bytes, int]]:
        return []  # a chunked prompt's uncomputed rest is not in the tree


def make_chunk_insertion(worker: "SimWorker", config: SchedulerConfig) -> WholePromptInsertion | PerChunkInsertion:
    return PerChunkInsertion(worker) if config.chunk_insertion == "per_chunk" else WholePromptInsertion(worker)

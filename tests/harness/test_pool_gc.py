"""repro.harness.pool: the garbage collector's thresholds while a sweep runs, and after."""

from __future__ import annotations

import pytest

from repro.harness import pool


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_sweep_collects_garbage_less_often_and_restores_the_thresholds(n_jobs):
    import gc

    before = gc.get_threshold()
    seen = []
    feed = pool.Feed()
    feed.put([pool.Task(gc.get_threshold, (), lambda value, error: seen.append((value, error)))])
    feed.close()
    pool.run_cells([], n_jobs, lambda out: None, feed)
    assert seen == [(pool.SWEEP_GC_THRESHOLD, None)]  # in the worker (or this process) while it ran
    assert gc.get_threshold() == before

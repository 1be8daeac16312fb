"""RLT as shipped (`rlt_shipped`) inside one real SGLang 0.5.23 server on this CPU (tiny random-weight Llama).

One server (KV pool 2048 tokens, seed 1), flushed, gets test_real_server.py's cyclic trace (more
prefixes than fit): the patched tree evicts by its own rules (its log line names the policy, its phases
and tokens), later rounds hit, and after /flush_cache the same trace gives the same cached tokens
request by request (the stream restarts with the flush: reproducible per seed).
"""

from __future__ import annotations

import os

import pytest

from repro.backends.sglang.rlt_patch import eviction_log_stats
from tests.live_server.conftest import MARK_VAR, server_python, wait_no_orphans
from tests.live_server.servers import flush, running_servers
from tests.live_server.test_real_server import KV_TOKENS, NUM_PREFIXES, cyclic_trace, replay_sequentially

pytestmark = [pytest.mark.sglang_server, pytest.mark.timeout(1800)]


def test_rlt_shipped_evicts_inside_the_server_and_repeats_after_flush(tmp_path):
    mark = f"shipped-{os.getpid()}"
    old = os.environ.get(MARK_VAR)
    os.environ[MARK_VAR] = mark
    try:
        with running_servers(server_python(), tmp_path, [("shipped", "rlt_shipped", 1)], KV_TOKENS) as (server,):
            trace = cyclic_trace()
            flush(server.url)  # the start-up warm-up request left tokens in the tree
            first = replay_sequentially(server.url, trace)
            stats = eviction_log_stats(server.log_text())
            flush(server.url)
            again = replay_sequentially(server.url, trace)
            log = server.log_text()
    finally:
        if old is None:
            os.environ.pop(MARK_VAR, None)
        else:
            os.environ[MARK_VAR] = old
    assert wait_no_orphans(mark) == [], "server processes outlived their stop"
    assert first[:NUM_PREFIXES] == [0] * NUM_PREFIXES
    assert stats is not None and stats["policy"] == "rlt_shipped", stats
    assert stats["evicted"] > 0 and stats["resets"] >= 1, stats
    assert sum(first[NUM_PREFIXES:]) > 0, first  # some prefixes survive a round
    assert again == first, "after /flush_cache the same trace differs"
    assert "Tree cache initialized: source=registered('repro_radix') impl=RadixCache" in log

"""Routing policies (ALGORITHMS.md §3): one class per policy, one conf/router/<name>.yaml each.

The same classes run inside the simulator and behind the live router service: they see
workers only through `WorkerView`, get time as `now_s`, and learn through
`on_request_complete`. Lifecycle: `reset(workers, seed)` -> `select_worker(request, workers,
now_s)` per arrival -> `on_request_complete(request, worker_id, latency_s, ttft_s,
cached_tokens, now_s)` per completion, or (live service only) `on_request_abandoned(request,
worker_id, now_s)` when the request will not complete on the worker it was routed to.
"""

from repro.routing.base import Router, WorkerView
from repro.routing.cache_aware import CacheAwareRouter
from repro.routing.dynamo import DynamoRouter
from repro.routing.fixed import FixedRouter
from repro.routing.lbgr import LBGRRouter
from repro.routing.lbgr_shipped import LBGRShippedRouter
from repro.routing.least_load import LeastLoadRouter
from repro.routing.llmd import LLMDRouter
from repro.routing.lmetric import LMetricRouter
from repro.routing.prefix_hash import PrefixHashRouter
from repro.routing.simple import PowerOfTwoRouter, RandomRouter, RoundRobinRouter

__all__ = [
    "Router",
    "WorkerView",
    "RandomRouter",
    "RoundRobinRouter",
    "FixedRouter",
    "CacheAwareRouter",
    "LBGRRouter",
    "LBGRShippedRouter",
    "PowerOfTwoRouter",
    "DynamoRouter",
    "LLMDRouter",
    "PrefixHashRouter",
    "LeastLoadRouter",
    "LMetricRouter",
]

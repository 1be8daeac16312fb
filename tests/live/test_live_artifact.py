"""protocol=artifact on the live path: the authors' clients in wall time, text-only requests, the
0.4.6 preset's flags, and whole emulated cells (no real server; tests/live_server has the real one).

The client driver (repro/backends/sglang/client_loop.py) is checked by spying on the very client
object it drives (the simulator's, repro.workloads.clients): every call is logged, and the log is
checked against the rules the simulator keeps (slots served in time order and never early, every
completion told after its final event and before the next send, the loop ends only when the
client has nothing left), plus a slow reference of the closed loop's state replayed over the log.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from repro.backends.sglang import backend, protocol
from repro.backends.sglang.client import ClientConfig
from repro.backends.sglang.client_loop import client_replay
from repro.workloads.clients import ClosedLoopPlan, WarmupThenOpenLoopPlan
from repro.workloads.request import Request

from live_helpers import CONF, need_parts, run_async


@pytest.fixture(autouse=True)
def _parts():
    need_parts()


class SlowWorker:
    """/generate that answers after a delay set by the prompt length, counting what is in flight."""

    def __init__(self):
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict] = []

    async def _generate(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            plen = len(body["input_ids"]) if "input_ids" in body else len(body["text"].split())
            await asyncio.sleep(0.005 * (1 + plen % 4))
            n = body["sampling_params"]["max_new_tokens"]
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            meta = {"id": body.get("rid"), "finish_reason": {"type": "length", "length": n},
                    "prompt_tokens": plen, "completion_tokens": n, "cached_tokens": 0}
            await resp.write(b"data: " + json.dumps({"text": "", "output_ids": list(range(n)), "meta_info": meta}).encode()
                             + b"\n\ndata: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1

    async def start(self):
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/generate", self._generate)
        self._runner, self.port = await protocol.serve_app(app, shutdown_timeout=0.5)

    async def stop(self):
        await self._runner.cleanup()


class Spy:
    """A client plan whose client logs every call the driver makes (with the driver's clock)."""

    def __init__(self, plan):
        self.plan, self.log, self.client = plan, [], None

    def describe(self):
        return self.plan.describe()

    @property
    def warmup(self):
        return self.plan.warmup

    def start(self, universe):
        inner = self.plan.start(universe)
        spy = self

        class _Client:
            expected_requests = inner.expected_requests

            def start(self):
                slots = inner.start()
                spy.log.append(("start", list(slots)))
                return slots

            def send(self, now, rid):
                req = inner.send(now, rid)
                spy.log.append(("send", now, rid, None if req is None else req))
                return req

            def on_complete(self, req, now):
                slots = inner.on_complete(req, now)
                spy.log.append(("complete", now, req.id, list(slots)))
                return slots

        self.client = inner
        return _Client()


def _universe(conversations, user_len=6):
    """Request objects for conversations of the given turn counts (turn k's prompt grows with k)."""
    rng = np.random.default_rng(0)
    reqs, convs = [], []
    for c, turns in enumerate(conversations):
        ids = []
        for k in range(turns):
            prompt = rng.integers(10, 50_000, user_len * (k + 1) + c).astype(np.int32)
            ids.append(len(reqs))
            reqs.append(Request(len(reqs), 0.0, prompt, 2, np.arange(2, dtype=np.int32), c, c, k,
                                " ".join(f"w{t}" for t in prompt.tolist())))
        convs.append(tuple(ids))
    return reqs, tuple(convs)


def _drive(plan, universe, **cfg):
    async def main():
        w = SlowWorker()
        await w.start()
        try:
            spy = Spy(plan)
            out = await client_replay(spy, universe, f"http://127.0.0.1:{w.port}", ClientConfig(**cfg))
            return out, spy, w
        finally:
            await w.stop()

    return run_async(main(), 120)


def _check_driver_rules(spy, records):
    """The simulator's contract (repro/workloads/clients.py), on the driver's log and the records."""
    finish = dict(zip(records["id"], records["finish_s"]))
    arrival = dict(zip(records["id"], records["arrival_s"]))
    slot_times = []
    told: set[int] = set()
    sent: list[int] = []
    for entry in spy.log:
        if entry[0] == "send":
            _, now, rid, req = entry
            slot_times.append(now)
            if req is not None:
                assert rid == len(sent) and req.id == rid and req.arrival_s == now
                assert arrival[rid] >= now - 1e-6  # never before its slot
                sent.append(rid)
        elif entry[0] == "complete":
            _, now, rid, slots = entry
            assert now >= finish[rid] - 1e-6 and rid not in told
            told.add(rid)
            assert all(s >= now for s in slots)
    assert slot_times == sorted(slot_times)  # slots in time order
    assert told == set(sent) == set(records["id"])  # the loop ended with nothing in flight
    assert list(records["id"]) == list(range(len(records)))


def _reference_closed_loop(plan, log):
    """A slow restatement of multi-turn.py's state over the driver's log: at each send, the drawn
    conversation must have turns left and the turn sent must be its next one."""
    done = [0] * len(plan.conversations)
    where = {}  # universe index -> (conversation, turn)
    for c, conv in enumerate(plan.conversations):
        for k, q in enumerate(conv):
            where[q] = (c, k)
    sent_turn = {}
    warm = len(plan.warmup)
    for entry in log:
        if entry[0] == "send" and entry[3] is not None:
            rid, req = entry[2], entry[3]
            if rid < warm:
                continue
            c, k = req.conversation_id, req.turn
            assert done[c] < len(plan.conversations[c]) and k == done[c], (c, k, done[c])
            sent_turn[rid] = (c, k)
        elif entry[0] == "send":  # an empty slot: nothing had turns left
            assert all(done[c] == len(conv) for c, conv in enumerate(plan.conversations))
        elif entry[0] == "complete" and entry[2] >= warm:
            c, k = sent_turn[entry[2]]
            done[c] = k + 1
    assert done == [len(conv) for conv in plan.conversations]


def test_the_closed_loop_runs_in_wall_time_as_the_simulator_asks():
    universe, convs = _universe([2, 4, 2, 4, 3, 1, 2, 4])
    plan = ClosedLoopPlan(convs, concurrency=4, poll_rate_per_s=200.0, seed=3, warmup=(0,), start_gap_s=0.05)
    (records, report), spy, worker = _drive(plan, universe)
    _check_driver_rules(spy, records)
    _reference_closed_loop(plan, spy.log)
    assert worker.max_in_flight <= 4 and report["client"]["max_in_flight"] == 4
    assert records["failed"].sum() == 0
    # turns are drawn among conversations with turns left, in flight or not: some are sent twice
    assert report["client"]["sent"] == len(records) >= plan.expected_requests
    assert report["client"]["duplicate_sends"] == len(records) - plan.expected_requests
    # the warm-up goes alone, and the loop starts start_gap_s after it finished
    assert records["arrival_s"].iloc[1] >= records["finish_s"].iloc[0] + 0.05 - 1e-6
    assert all("input_ids" in b for b in worker.bodies)  # send_ids defaults to the exact ids


def test_warmup_then_poisson_and_text_only_requests():
    universe, _ = _universe([1] * 12)
    offsets = tuple(np.cumsum(np.random.default_rng(1).exponential(0.02, 11)) - 0.0)
    plan = WarmupThenOpenLoopPlan(warmup=(0,), stream=tuple(range(1, 12)), offsets_s=offsets, start_gap_s=0.1)
    (records, report), spy, worker = _drive(plan, universe, send_ids=False)
    _check_driver_rules(spy, records)
    assert len(records) == 12 and report["client"]["dropped_slots"] == 0
    t0 = records["finish_s"].iloc[0] + 0.1
    assert (records["arrival_s"].iloc[1:].to_numpy() >= t0 + np.asarray(offsets) - 1e-6).all()
    # text alone, as the authors' clients send it; the server's prompt length is what is recorded
    assert all("input_ids" not in b and b["text"] for b in worker.bodies)
    assert (records["prompt_tokens"].to_numpy() == [len(u.prompt_tokens) for u in universe]).all()


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=overrides)


SHRUNK = [
    "protocol=artifact", "cluster.num_workers=2",
    "protocol.workloads.gsp.num_groups=6", "protocol.workloads.gsp.prompts_per_group=4",
    "protocol.workloads.gsp.total_lens=[256,512]",
    "protocol.workloads.sharegpt.num_clients=6", "protocol.workloads.sharegpt.turns_per_client=[2,4]",
    "protocol.workloads.sharegpt.user_tokens=[128]", "protocol.workloads.sharegpt.concurrency=4",
]


def test_the_artifact_preset_becomes_server_flags_and_named_gaps(tmp_path):
    from repro.backends import assembly
    from repro.backends.sglang import orchestrate
    from repro.backends.sglang.commands import server_preset_gaps

    cfg = _compose(["backend=sglang", "backend.gpus=[0,1]", "backend.placement=local", "workload=gsp",
                    "policy=lbgr_shipped_rlt_shipped", *SHRUNK])
    plan_ = assembly.plan_cell(cfg)
    from omegaconf import OmegaConf
    from dataclasses import asdict

    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["cluster"]["scheduler"] = asdict(plan_.scheduler)
    plan = orchestrate.plan_cell(plain, plan_.capacities, plan_.seeds, tmp_path)
    cmd = plan.workers[0].cmd
    flag = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}
    assert flag["--radix-eviction-policy"] == "rlt_shipped" and flag["--schedule-policy"] == "fcfs"
    assert flag["--chunked-prefill-size"] == "8192" and flag["--max-prefill-tokens"] == "16384"
    assert flag["--mem-fraction-static"] == "0.88" and "--max-total-tokens" not in cmd
    assert "--max-running-requests" not in cmd  # null: no flag
    assert plan.client["send_ids"] is False and plan.router.config["router"]["name"] == "lbgr_shipped"
    gaps = server_preset_gaps(plain["cluster"]["scheduler"])
    # the preset admits with 0.5.23's arithmetic (ALGORITHMS.md section 7): two gaps, not three
    assert len(gaps) == 2 and any("whole allocation" in g for g in gaps) and any("max_running" in g for g in gaps)
    # the text protocol's scheduler asks nothing 0.5.23 lacks, and its client sends the ids
    text = _compose(["backend=sglang", "backend.gpus=[0,1]", "backend.placement=local", "cluster.num_workers=2"])
    tplan = assembly.plan_cell(text)
    assert server_preset_gaps(asdict(tplan.scheduler)) == []


@pytest.mark.parametrize("workload, policy", [
    ("sharegpt", "lbgr_shipped_rlt_shipped"),
    pytest.param("gsp", "cache_aware_014_lru", marks=pytest.mark.slow),  # ~20 s each; the closed loop stays in CI
])
def test_an_artifact_cell_on_emulated_workers(workload, policy, tmp_path):
    from repro.metrics.summary import summarize

    cfg = _compose(["backend=sglang", "backend.emulate=true", "backend.time_scale=10", f"workload={workload}",
                    f"policy={policy}", f"results_dir={tmp_path}", "exp_name=live_artifact", *SHRUNK])
    res = backend.run_cell(cfg)
    prov = res.provenance
    loop = prov["client_loop"]
    s = summarize(res.records, prov, definition="artifact")
    assert s["num_failed"] == 0 and s["num_requests"] == loop["sent"] == len(res.records)
    assert s["provenance"]["metric_definition"] == "artifact" and 0 < s["hit_rate"] < 1
    assert loop["client"] == prov["workload"]["client"]["client"] and loop["warmup_requests"] == 1
    if workload == "sharegpt":
        assert loop["client"] == "closed_loop" and loop["max_in_flight"] <= 4
        assert loop["sent"] >= 1 + 18  # warm-up + every turn (6 conversations of 2/4 turns), duplicates on top
    else:
        assert loop["client"] == "warmup_then_open_loop" and loop["sent"] == 1 + 24
    assert prov["router_service"]["callbacks"] == loop["sent"]
    plan = json.loads((Path(res.timings["log_dir"]) / "plan.json").read_text())
    assert plan["client"]["send_ids"] is False

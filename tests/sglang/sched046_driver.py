"""One scheduling decision by SGLang 0.4.6's own SchedulePolicy / PrefillAdder and by our SimWorker
under the 0.4.6 preset (`prefill_adder: sglang_0_4_6`), on the states of tests/sglang/sched_driver.py.

SGLang 0.4.6 cannot share a process with 0.5.23 (one `sglang` package per process), so this runs
as its own process with .venv-sglang's interpreter and .venv-sglang046 (sglang==0.4.6 installed
there with --no-deps, scripts/make_sglang046_env.sh) first on sys.path:

    PYTHONPATH=. .venv-sglang/bin/python -m tests.sglang.sched046_driver [N] [--json]

0.4.6's import chain of schedule_policy reaches its quantization layers (they patch vLLM classes
at import) and a `torch.compile` decorator; on this CPU those are stubbed below (none is used by
the scheduling code), and triton is stubbed by repro.backends.sglang.cpu_shims (it loads the stub
file of the 0.5.23 package, which is why .venv-sglang's own sglang must be findable first).

SGLang side: 0.4.6's RadixCache (page 1, no allocator) holds the state; SchedulePolicy.calc_priority
ranks; PrefillAdder admits over an allocator stand-in (available = capacity - tree - generated
tokens of the running requests). What we restate is only get_new_batch_prefill's loop
(scheduler.py), in 0.4.6's order. Requests are ignore_eos with new_token_ratio at its initial 0.7
unless given: 0.4.6 applies the ratio to the running requests' outputs even then.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from types import SimpleNamespace

import numpy as np

from tests.sglang import sched_driver as D

SITE_ENV = "REPRO_SGLANG046_SITE"  # the --target folder holding sglang 0.4.6
DEFAULT_SITE = ".venv-sglang046/site"
STUBBED = ("vllm", "sglang.srt.layers.quantization")
PRESET = dict(
    in_batch_prefix_caching=True,
    lpm_rank_access="match",
    exact_budgets=True,
    chunk_insertion="per_chunk",
    prefill_adder="sglang_0_4_6",
    evict_request="whole",
)
_SG = None


def site_dir() -> str:
    return os.environ.get(SITE_ENV) or os.path.join(os.path.dirname(__file__), "..", "..", DEFAULT_SITE)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, make_mock):
        self.make_mock = make_mock

    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in STUBBED):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = self.make_mock(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_sglang046() -> SimpleNamespace:
    """SGLang 0.4.6's scheduling modules. ImportError (with the reason) when they cannot load."""
    global _SG
    if _SG is not None:
        return _SG
    site = os.path.abspath(site_dir())
    if not os.path.isdir(os.path.join(site, "sglang")):
        raise ImportError(f"no sglang 0.4.6 in {site} (make it with scripts/make_sglang046_env.sh)")
    if "sglang" in sys.modules:
        raise ImportError("another sglang is imported in this process already")
    from repro.backends.sglang import cpu_shims

    cpu_shims.install()  # triton: the stub file of .venv-sglang's own (0.5.23) package
    stubs = sys.modules["_repro_sglang_platform_stubs"]
    sys.meta_path.insert(0, _StubFinder(stubs._make_mock))
    import torch

    def compile_stub(fn=None, **kwargs):  # forward_batch_info.py decorates a helper at import
        return fn if fn is not None else (lambda f: f)

    torch.compile = compile_stub
    sys.path.insert(0, site)
    import sglang

    if sglang.__version__ != "0.4.6":
        raise ImportError(f"{site} holds sglang {sglang.__version__}, not 0.4.6")
    from sglang.srt.managers import schedule_policy
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams

    _SG = SimpleNamespace(
        torch=torch,
        sp=schedule_policy,
        Req=Req,
        RadixCache=RadixCache,
        SamplingParams=SamplingParams,
        version=sglang.__version__,
        file=sglang.__file__,
    )
    return _SG


class _Allocator:
    """available_size() = capacity - the tree's tokens - the running requests' generated tokens."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.tree = None
        self.held = 0

    def available_size(self):
        return self.capacity - self.tree.total_size() - self.held


def _req(sg, rid, prompt, out, ignore_eos=True):
    params = sg.SamplingParams(max_new_tokens=int(out), ignore_eos=ignore_eos)
    params.normalize(None)
    return sg.Req(str(rid), "", [int(t) for t in prompt], params)


INIT_RATIO = 0.7  # global_config.py: SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness 1.0


def sglang046_decide(state: D.SchedState, new_token_ratio: float = INIT_RATIO) -> D.Decision:
    sg = import_sglang046()
    torch = sg.torch
    alloc = _Allocator(state.capacity)
    tree = sg.RadixCache(req_to_token_pool=None, token_to_kv_pool_allocator=None, page_size=1, disable=False)
    alloc.tree = tree

    def insert(tokens):
        key = [int(t) for t in tokens]
        tree.insert(key, torch.arange(len(key), dtype=torch.int64))
        return tree.match_prefix(key)[1]

    for seq in state.cached:
        insert(seq)
    running = []
    for k, (prompt, out, gen) in enumerate(state.running):
        r = _req(sg, f"run{k}", prompt, out)
        tree.inc_lock_ref(insert(prompt))
        r.output_ids = [7] * int(gen)
        alloc.held += int(gen)
        running.append(r)
    chunked = None
    if state.chunked is not None:  # after cache_unfinished_req: its computed part in the tree, locked
        prompt, out, done = state.chunked
        chunked = _req(sg, "chunked", prompt, out)
        node = insert(prompt[:done])
        tree.inc_lock_ref(node)
        chunked.prefix_indices = torch.arange(int(done), dtype=torch.int64)
        chunked.last_node = node
    waiting = [_req(sg, i, prompt, out) for i, (prompt, out) in enumerate(state.waiting)]
    batch = SimpleNamespace(reqs=running)
    held = (int(tree.total_size()), int(tree.evictable_size()))
    chunk = state.chunked_prefill_size if state.chunked_prefill_size and state.chunked_prefill_size > 0 else None
    # --- Scheduler.get_new_batch_prefill of 0.4.6 (no grammar, LoRA, hierarchical cache or mixed chunk)
    running_bs = len(running)
    if not waiting and chunked is None:
        return D.Decision([int(r.rid) for r in waiting], [], None, None, "no_pass", held)
    if running_bs >= state.max_running_requests:  # even the chunked request waits (no chunk: 0)
        return D.Decision([int(r.rid) for r in waiting], [], 0 if chunked else None, None, "no_pass", held)
    policy = sg.sp.SchedulePolicy(state.policy, tree, False)
    prefix_computed = policy.calc_priority(waiting)
    order = [int(r.rid) for r in waiting]
    adder = sg.sp.PrefillAdder(tree, alloc, batch, new_token_ratio, state.max_prefill_tokens, chunk, 0)
    chunk_continue = None
    if chunked is not None:
        chunked.init_next_round_input()
        adder.add_chunked_req(chunked)
        chunk_continue = chunked.extend_input_len
    stop = "drained"
    for r in waiting:
        if running_bs + len(adder.can_run_list) >= state.max_running_requests:
            stop = "slots"
            break
        r.init_next_round_input(None if prefix_computed else tree)
        res = adder.add_one_req(r, chunked, False)
        if res != sg.sp.AddReqResult.CONTINUE:
            admitted_it = bool(adder.can_run_list) and adder.can_run_list[-1] is r
            stop = ("budget" if res == sg.sp.AddReqResult.OTHER else "memory") + ("" if admitted_it else "_refused")
            break
    admitted = [
        (int(r.rid), len(r.prefix_indices), int(r.extend_input_len)) for r in adder.can_run_list if r is not chunked
    ]
    new_chunked = int(adder.new_chunked_req.rid) if adder.new_chunked_req is not None else None
    return D.Decision(order, admitted, chunk_continue, new_chunked, stop, held)


def ours046_decide(state: D.SchedState, new_token_ratio: float = INIT_RATIO, **modes) -> tuple[D.Decision, str]:
    """Our decision under the 0.4.6 preset, and why our pass stopped refusing ("physical": our full
    output reservation, not 0.4.6's arithmetic)."""
    cfg = {**PRESET, **modes}
    seen = {}

    def hook(w):
        adder = w.prefill_adder
        adder.ratio = new_token_ratio
        for k, (_, _, gen) in enumerate(state.running):
            adder.note_running(k, gen)
        seen["adder"] = adder

    d = D.ours_decide(state, before_pass=hook, **cfg)
    return d, seen["adder"].refused


def compare(state: D.SchedState, new_token_ratio: float = INIT_RATIO) -> dict:
    theirs = sglang046_decide(state, new_token_ratio)
    ours, refused = ours046_decide(state, new_token_ratio)
    ka, kb = theirs.kinds(), ours.kinds()
    diff = {k: [repr(ka[k]), repr(kb[k])] for k in D.KINDS if ka[k] != kb[k]}
    ours_adm = [i for i, _, _ in ours.admitted]
    their_adm = [i for i, _, _ in theirs.admitted]
    physical = refused == "physical" and their_adm[: len(ours_adm)] == ours_adm and len(their_adm) > len(ours_adm)
    # the 0.5.23 arithmetic on the same state: how often the two versions' rules decide differently
    k523 = D.ours_decide(state, **D.EXACT).kinds()
    v0523_differs = any(ka[k] != k523[k] for k in D.KINDS)
    return {
        "diff": diff,
        "physical": physical,
        "tags": sorted(D.coverage(state, theirs)),
        "stop": theirs.stop,
        "v0523_differs": v0523_differs,
    }


def run(n_states: int, seed0: int = 0) -> dict:
    """Listed cases (sched_driver's, exact at ratio 1.0 and 0.7) and `n_states` generated states."""
    from tests.sglang import test_sched_parity as P

    sg = import_sglang046()
    out = {"sglang": sg.version, "sglang_file": sg.file, "cases": {}, "generated": []}
    for name, state in sorted(P.CASES.items()):
        out["cases"][name] = {str(r): compare(state, r) for r in (1.0, INIT_RATIO)}
    for k in range(n_states):
        st = D.random_state(np.random.default_rng(seed0 + k), big_queue=(k % 20 == 0))
        ratio = (1.0, INIT_RATIO, 0.098)[k % 3]
        res = compare(st, ratio)
        res["seed"] = seed0 + k
        res["ratio"] = ratio
        out["generated"].append(res)
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 3000
    result = run(n)
    if "--json" in sys.argv:
        json.dump(result, sys.stdout)
    else:
        gen = result["generated"]
        exact = sum(1 for g in gen if not g["diff"])
        phys = sum(1 for g in gen if g["diff"] and g["physical"])
        print(
            f"SGLang {result['sglang']}: {n} generated states, {exact} identical, {phys} differ only where our full "
            f"output reservation refuses what 0.4.6 admits, {n - exact - phys} other"
        )
        for name, rs in result["cases"].items():
            print(
                f"  {name:34s} "
                + "  ".join(f"ratio {r}: {'ok' if not v['diff'] else v['diff']}" for r, v in rs.items())
            )

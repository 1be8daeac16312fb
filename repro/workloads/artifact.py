"""The workloads as the authors' scripts generate them (variant `artifact`, selected by protocol=artifact).

Facts read from GitHub fzwark/KVRouting at fc3b2a1 (gsp.sh, multi_conv.sh + multi-turn.py,
long.sh + long.py, the patched sglang-0.4.6 bench_serving.py); what we had to assume is said
where it is used. This module: the text round trips their clients make, the split of a group's
prompts into a shared segment and the rest, and the open-loop GSP variant. Multi-turn:
artifact_chat.py; LooGLE: artifact_loogle.py; the clients: clients.py.

Their tokenizer is Llama-3.1's (transformers' AutoTokenizer): `encode` adds `<|begin_of_text|>`
(BOS) and the server adds one to every text it is sent. We use our Llama-3 tokenizer
(tokenizer.py, the same vocabulary) and write BOS explicitly. Their decode also cleans up spaces
before punctuation (`clean_up_tokenization_spaces`); ours does not: a token or two per prompt.

GSP (bench_serving `sample_generated_shared_prefix_requests` + `_parse_total_lens`, as gsp.sh
calls it: 128 groups x 32 prompts, `--gsp-total-lens 512,1024,2048,4096,8192`, prefix ratio 0.5,
4 output tokens, 12 req/s, `--gsp-order $ORDER`, random in the README's command):
* group g's total length L = total_lens[g % len(total_lens)];
* system prompt: S = min(max(1, round(r L)), max(L - 1, 1)) ids drawn uniformly over the whole
  vocabulary (special tokens included), decoded to text; if its encoding (with BOS) is not S ids
  long it is cut to the first S (BOS included) or padded with its own first ids, decoded once
  more and not checked again; the group's system length is the final text's encoding length;
* each question the same way with max(1, L - that) ids; prompt text = system + "\\n\\n" + question;
* order: random = one shuffle of all prompts (their Python `random`, seeded with --seed 1),
  round_robin = prompt i of every group in turn; grouped is not offered;
* one warm-up request (the first prompt of the order, 4 output tokens) before the timed stream;
  its cache flush goes to the router, which has no /flush_cache (404): nothing is flushed;
* Poisson arrivals, the first at once, 1 s after the warm-up (their sleep).
Here the ids and the order come from `artifact.seed` (their fixed --seed 1: the same requests in
every cell) through our generators, not Python's; the arrivals from the cell's seed.
"""

from __future__ import annotations

import numpy as np

from repro.workloads.arrivals import component_rng, order_round_robin, poisson_arrivals
from repro.workloads.clients import WarmupThenOpenLoopPlan
from repro.workloads.pool import Pool, PoolBuilder
from repro.workloads.request import Request

GSP_ARTIFACT_DEFAULTS = {
    "num_groups": 128,
    "prompts_per_group": 32,
    "total_lens": [512, 1024, 2048, 4096, 8192],
    "prefix_ratio": 0.5,
    "seed": 1,  # prompts and order (their --seed default); null = the cell's seed
    "warmup_requests": 1,
    "start_gap_s": 1.0,
}


def their_encode(tokenizer, text: str) -> np.ndarray:
    """transformers' `encode(text)` for Llama-3: BOS + the text's ids."""
    return np.concatenate([np.array([tokenizer.bos_id], dtype=np.int32), tokenizer.encode(text)])


def random_texts_ids(rng: np.random.Generator, tokenizer, n: int, k: int) -> tuple[list[str], list[np.ndarray | None]]:
    """bench_serving's `gen_prompt` + its one cut-or-pad pass, k times: texts meant to encode to n
    ids; and each text's ids (`tokenizer.encode`, no BOS) where they were computed
    on the way (a text kept as drawn), else None (a cut or padded text is not encoded again)."""
    draws = [rng.integers(0, tokenizer.vocab_size, size=n) for _ in range(k)]
    texts = tokenizer.decode_batch(draws)  # one batch call each way (threads)
    out: list[str | None] = []
    known: list[np.ndarray | None] = []
    redo = []
    for text, ids in zip(texts, tokenizer.encode_batch(texts)):
        if len(ids) + 1 == n:  # with BOS
            out.append(text)
            known.append(ids)
            continue
        ids = np.concatenate([[tokenizer.bos_id], ids]).astype(np.int32)
        redo.append((len(out), ids[:n] if len(ids) > n else np.concatenate([ids, ids[: n - len(ids)]])))
        out.append(None)
        known.append(None)
    for (i, _), text in zip(redo, tokenizer.decode_batch([ids for _, ids in redo])):
        out[i] = text
    return [t for t in out if t is not None], known


def encode_after(tokenizer, head: str, head_ids: np.ndarray, texts: list[str], known: list) -> list[np.ndarray]:
    """encode(head + t) for each text t, given encode(head) and t's own ids where known. A text
    that opens with a special token (a cut one starts with BOS) joins: encode(head) ++ encode(t),
    so head is not encoded again for each; any other text is encoded whole."""
    opens = getattr(tokenizer, "starts_with_special", None)
    joins = [opens is not None and opens(t) for t in texts]
    own = list(known)
    todo = [i for i, t in enumerate(texts) if joins[i] and own[i] is None]
    for i, x in zip(todo, tokenizer.encode_batch([texts[i] for i in todo])):
        own[i] = x
    whole = [i for i in range(len(texts)) if not joins[i]]
    out: list = [None] * len(texts)
    for i, x in zip(whole, tokenizer.encode_batch([head + texts[i] for i in whole])):
        out[i] = np.asarray(x, dtype=np.int32)
    for i in range(len(texts)):
        if joins[i]:
            out[i] = np.concatenate([head_ids, own[i]]).astype(np.int32)
    return out


def split_shared(builder: PoolBuilder, texts: list[tuple[str, str]], ids: list[np.ndarray]) -> list[tuple[int, int]]:
    """Segments (shared, own) of a group's prompts: the shared one holds the group's longest
    common token prefix (what a radix cache can share) with the first text part, the own one
    the rest. A prompt's text and ids stay exactly its text and its server-side ids."""
    lcp = len(ids[0])
    for x in ids[1:]:
        m = min(lcp, len(x))
        neq = np.flatnonzero(ids[0][:m] != x[:m])
        lcp = int(neq[0]) if len(neq) else m
    lcp = min(lcp, min(len(x) for x in ids) - 1)  # every prompt keeps an own token
    shared = builder.segment(texts[0][0], ids[0][:lcp])
    return [(shared, builder.segment(t[1], x[lcp:])) for t, x in zip(texts, ids)]


# text-variant GSP keys the artifact has its own settings for (artifact.<key>); a value other than
# the default is refused rather than ignored (a sweep over them would give equal cells)
TEXT_ONLY = {
    "num_groups": "num_groups",
    "prompts_per_group": "prompts_per_group",
    "system_prompt_len": "total_lens",
    "question_len": "total_lens",
    "range_ratio": "total_lens",
    "system_prompt_len_range": "total_lens",
}


def validate_gsp(p, c: dict, text_defaults: dict) -> None:
    a = c["artifact"]
    for key, theirs in TEXT_ONLY.items():
        if c.get(key) != text_defaults[key]:
            p.add(f"workload.{key} belongs to the text GSP; under protocol=artifact set workload.artifact.{theirs}")
    if c.get("shared_prefix_ratio") is not None:  # Fig. 10's knob is their --gsp-prefix-ratio
        a["prefix_ratio"] = c["shared_prefix_ratio"]
    p.int_(a, "num_groups", 1)
    p.int_(a, "prompts_per_group", 1)
    p.float_(a, "prefix_ratio", lo=0.0, hi=1.0, lo_open=True)
    if isinstance(a.get("prefix_ratio"), float) and a["prefix_ratio"] >= 1.0:
        p.add("artifact.prefix_ratio must be in (0, 1), as bench_serving requires")
    lens = a.get("total_lens")
    if not (isinstance(lens, list) and lens and all(isinstance(x, int) and x >= 2 for x in lens)):
        p.add(f"artifact.total_lens must be a non-empty list of integers >= 2, got {lens!r}")
    p.int_(a, "seed", 0, allow_none=True)
    p.int_(a, "warmup_requests", 0)
    p.float_(a, "start_gap_s", lo=0.0)
    if c["tokenizer"]["kind"] != "llama3":
        p.add(
            "the artifact GSP decodes random ids to text as their Llama-3 tokenizer does: tokenizer.kind must be llama3"
        )
    if c["order"] not in ("random", "round_robin"):
        p.add(f"order {c['order']!r}: the artifact GSP offers random and round_robin")


def make_gsp_pool(cfg: dict, seed: int, tokenizer) -> Pool:
    a = cfg["artifact"]
    G, P, r = a["num_groups"], a["prompts_per_group"], a["prefix_ratio"]
    lens = [a["total_lens"][g % len(a["total_lens"])] for g in range(G)]
    rng = component_rng(seed, "gsp.artifact.tokens")
    b = PoolBuilder(tokenizer)
    sys_lens = []
    for g, L in enumerate(lens):
        S = min(max(1, int(round(r * L))), max(L - 1, 1))
        (sp,), (sp_ids,) = random_texts_ids(rng, tokenizer, S, 1)
        if sp_ids is None:
            sp_ids = tokenizer.encode(sp)
        S_real = 1 + len(sp_ids)  # their_encode(sp): BOS + its ids
        sys_lens.append(S_real)
        Q = max(1, L - S_real)
        questions, q_ids = random_texts_ids(rng, tokenizer, Q, P)
        texts = [(sp + "\n\n", q) for q in questions]
        head_ids = tokenizer.encode(sp + "\n\n")
        bos = np.array([tokenizer.bos_id], dtype=np.int32)  # what the server tokenises: BOS + the text
        ids = [np.concatenate([bos, x]) for x in encode_after(tokenizer, sp + "\n\n", head_ids, questions, q_ids)]
        for j, (segs, _) in enumerate(zip(split_shared(b, texts, ids), ids)):
            gen = rng.integers(0, tokenizer.vocab_size, size=cfg["output_len"]).astype(np.int32)
            b.add_query(list(segs), gen, group=g, conversation=g * P + j, turn=0)
    prov = {
        "rows_read": 0,
        "malformed_rows": 0,
        "num_groups": G,
        "prompts_per_group": P,
        "total_lens": lens[: len(a["total_lens"])],
        "system_prompt_tokens_mean": float(np.mean(sys_lens)),
        "filtered": {},
    }
    return b.build(prov)


def gsp_requests(cfg: dict, pool: Pool, seed: int) -> tuple[list[Request], WarmupThenOpenLoopPlan]:
    a = cfg["artifact"]
    data_seed = seed if a["seed"] is None else a["seed"]
    if cfg["order"] == "random":
        order = component_rng(data_seed, "gsp.artifact.order").permutation(len(pool))
    else:
        order = order_round_robin(pool.q_group)
    if cfg["num_queries"] is not None:
        order = order[: cfg["num_queries"]]
    return open_loop(pool, order, cfg["request_rate"], seed, a["warmup_requests"], a["start_gap_s"])


def universe(pool: Pool) -> list[Request]:
    """One request per pool query (ids = query index, arrival 0): what a client may send."""
    return [Request.from_pool(pool, q, q, 0.0, pool.q_generated[q]) for q in range(len(pool))]


def open_loop(
    pool: Pool, order, rate: float, seed: int, warmup: int, gap_s: float
) -> tuple[list[Request], WarmupThenOpenLoopPlan]:
    order = [int(q) for q in order]
    offsets = poisson_arrivals(len(order), rate, component_rng(seed, "arrivals"))
    plan = WarmupThenOpenLoopPlan(
        warmup=tuple(order[:1] * warmup),
        stream=tuple(order),
        offsets_s=tuple(float(t) for t in offsets),
        start_gap_s=float(gap_s),
    )
    return universe(pool), plan

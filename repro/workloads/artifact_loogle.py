"""LooGLE as long.py builds it (variant artifact): documents cut in rotation, raw /generate text.

Facts (long.py at fzwark/KVRouting fc3b2a1, as long.sh calls it: --num-groups 512,
--max-q-per-group 100, --doc-lens 1024,2048,4096,8192, 4 output tokens, 12 req/s):
* rows without questions are dropped; if more than `num_groups` documents remain, a random
  sample of that many (their random.sample), else all of them in file order;
* per document: its first `max_q_per_group` questions; the budget is
  8192 - 64 - output_len - (the longest "Input:\\n{DOC}\\n\\nQuestion: <q>" in tokens), and the
  document is cut to min(doc_lens[i % 4], budget) ids of its encoding (BOS included, so one
  text token fewer), decoded without special tokens; documents rotate in the order chosen;
* prompt text = "Input:\\n" + document + "\\n\\nQuestion: " + question, sent to /generate as text
  (the server adds BOS); Poisson arrivals, the first at once; no warm-up;
* order: long.sh never passes --order, so their runs were random (one shuffle of all
  questions); round_robin (question i of every document in turn) is offered as long.py has it.
Ours: the documents are the labelled stand-in unless a LooGLE file is given; the stand-in has
`stand_in_documents` documents (our number: their file's count is not in the scripts). The
generated tokens are the first output_len tokens of the recorded answer (EOS-padded).
"""

from __future__ import annotations

import numpy as np

from repro.workloads.arrivals import component_rng, order_round_robin
from repro.workloads.artifact import open_loop, split_shared, their_encode
from repro.workloads.pool import Pool, PoolBuilder, generated_tokens

LOOGLE_ARTIFACT_DEFAULTS = {
    "num_groups": 512,
    "max_q_per_group": 100,
    "doc_lens": [1024, 2048, 4096, 8192],
    "context_limit": 8192,
    "context_safety": 64,
    "seed": 1,  # document sample and order (their --seed default); null = the cell's seed
    "stand_in_documents": 100,
}


def validate_loogle(p, c: dict) -> None:
    a = c["artifact"]
    for k in ("num_groups", "max_q_per_group", "context_limit", "stand_in_documents"):
        p.int_(a, k, 1)
    p.int_(a, "context_safety", 0)
    p.int_(a, "seed", 0, allow_none=True)
    v = a.get("doc_lens")
    if not (isinstance(v, list) and v and all(isinstance(x, int) and x >= 1 for x in v)):
        p.add(f"artifact.doc_lens must be a non-empty list of integers >= 1, got {v!r}")
    if c["tokenizer"]["kind"] != "llama3":
        p.add("the artifact LooGLE cuts documents with Llama-3's tokenizer: tokenizer.kind must be llama3")
    if c["mode"] != "shared_prefix":
        p.add("the artifact LooGLE sends each question alone (mode shared_prefix)")


def choose_documents(docs: list, a: dict, rng: np.random.Generator) -> list:
    if a["num_groups"] >= len(docs):
        return list(docs)
    return [docs[i] for i in rng.choice(len(docs), size=a["num_groups"], replace=False).tolist()]


def make_loogle_pool(cfg: dict, docs: list[tuple[str, list[tuple[str, str]]]], tokenizer, prov: dict) -> Pool:
    """`docs`: (document, [(Q, A), ...]) already chosen, in order."""
    a = cfg["artifact"]
    b = PoolBuilder(tokenizer)
    out_len = cfg["output_len"]
    doc_tokens = []
    for g, (doc, qas) in enumerate(docs):
        qas = qas[: a["max_q_per_group"]]
        questions = [q for q, _ in qas]
        tmpl = tokenizer.encode_batch([f"Input:\n{{DOC}}\n\nQuestion: {q}" for q in questions])
        budget = max(a["context_limit"] - a["context_safety"] - out_len - max(len(t) for t in tmpl), 0)
        doc_budget = min(a["doc_lens"][g % len(a["doc_lens"])], budget)
        ids = their_encode(tokenizer, doc)
        if len(ids) > doc_budget:
            doc = tokenizer.decode(ids[1:doc_budget])  # their slice keeps BOS, then skips it in decode
        texts = [("Input:\n" + doc + "\n\nQuestion: ", q) for q in questions]
        bos = np.array([tokenizer.bos_id], dtype=np.int32)
        full = [np.concatenate([bos, x]) for x in tokenizer.encode_batch(["".join(t) for t in texts])]
        for segs, (_, ans) in zip(split_shared(b, texts, full), qas):
            gen, _ = generated_tokens(tokenizer.encode(ans), out_len, tokenizer.eos_id)
            b.add_query(list(segs), gen, group=g, conversation=len(b), turn=0)
        doc_tokens.append(len(tokenizer.encode(doc)))
    prov.update(
        {
            "documents_used": len(docs),
            "document_tokens_mean": float(np.mean(doc_tokens)) if doc_tokens else 0.0,
            "filtered": {},
        }
    )
    return b.build(prov)


def loogle_requests(cfg: dict, pool: Pool, seed: int):
    a = cfg["artifact"]
    data_seed = seed if a["seed"] is None else a["seed"]
    if cfg["order"] == "random":
        order = component_rng(data_seed, "loogle.artifact.order").permutation(len(pool))
    else:
        order = order_round_robin(pool.q_group)
    if cfg["num_queries"] is not None:
        order = order[: cfg["num_queries"]]
    return open_loop(pool, order, cfg["request_rate"], seed, warmup=0, gap_s=0.0)

"""ShareGPT / UltraChat as multi-turn.py builds them, for the closed-loop client (variant artifact).

Facts (multi-turn.py at fzwark/KVRouting fc3b2a1, as multi_conv.sh calls it):
* conversations in file order; a message's role is "user" for from=human|user, "assistant" for
  gpt|assistant; the first `num_clients` (128) conversations with >= `min_user_turns` user
  messages (--turns-per-client, default 8, not passed) are kept, each cut to its first
  `turns_per_client[i % 4]` user messages (--turns-per-client-list 2,4,6,8, round robin): 640 turns;
* each user message forced to exactly `user_tokens` tokens (--per-turn-user-len-list 1024): cut
  to its first 1024 ids or padded with the single-token " a", decoded, and re-checked up to three
  times (`force_len_tokens`);
* a turn is sent to /v1/chat/completions with the history: the server applies Llama-3.1's chat
  template (BOS, its default system block with the knowledge and today dates, then per message a
  header, the trimmed content and <|eot_id|>, and the assistant header); the history holds the
  model's own replies, 4 tokens (max_tokens 4, ignore_eos);
* the client: clients.ClosedLoop, 128 in flight (max_concurrency defaults to num_clients), the
  request rate paces its polling, one warm-up (conversation 0's first turn) 1 s before.
Ours: the model's 4-token reply is the first 4 tokens of the recorded reply (EOS-padded), as the
text protocol's generated tokens; UltraChat is the labelled stand-in unless a file is given.
multi_conv.sh reads $11 as the dataset and $12 as the lengths while its README passes them as $10
and $11 (everything after $9 shifted by one): we take the README's values (sharegpt|ultrachat,
1024 tokens, 4 output tokens, 12 req/s). Their UltraChat loader reads `conversations`/`messages`
keys, which the raw UltraChat release does not have: they must have run a converted file.
"""

from __future__ import annotations

import numpy as np

from repro.workloads.arrivals import component_rng
from repro.workloads.artifact import universe
from repro.workloads.base import WorkloadError
from repro.workloads.clients import ClosedLoopPlan
from repro.workloads.pool import Pool, PoolBuilder, generated_tokens

CHAT_ARTIFACT_DEFAULTS = {
    "num_clients": 128,
    "min_user_turns": 8,
    "turns_per_client": [2, 4, 6, 8],
    "user_tokens": [1024],
    "concurrency": None,  # null = num_clients (their default)
    "warmup_requests": 1,
    "start_gap_s": 1.0,
    "system_block": True,  # Llama-3.1's template writes its default system block
    "seed": 1,  # data drawn at random (the UltraChat stand-in) as one fixed file; null = the cell's seed
}

# Llama-3.1-Instruct's chat template (tokenizer_config.json) without a system message
LLAMA31_SYSTEM_BLOCK = (
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n<|eot_id|>"
)
USER_HEADER = "<|start_header_id|>user<|end_header_id|>\n\n"
ASSISTANT_HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"
EOT = "<|eot_id|>"
PAD_TEXT = " a"  # their benign single token (the first of their candidates that is one)


def validate_chat(p, c: dict) -> None:
    a = c["artifact"]
    p.int_(a, "num_clients", 1)
    p.int_(a, "min_user_turns", 1)
    p.int_(a, "concurrency", 1, allow_none=True)
    p.int_(a, "warmup_requests", 0)
    p.float_(a, "start_gap_s", lo=0.0)
    p.int_(a, "seed", 0, allow_none=True)
    for key in ("turns_per_client", "user_tokens"):
        v = a.get(key)
        if not (isinstance(v, list) and v and all(isinstance(x, int) and x >= 1 for x in v)):
            p.add(f"artifact.{key} must be a non-empty list of integers >= 1, got {v!r}")
    if c["num_queries"] is not None:
        p.add("the artifact's closed loop sends until every conversation is done: num_queries must be null")
    if c["tokenizer"]["kind"] != "llama3":
        p.add("the artifact multi-turn prompts use Llama-3.1's chat template: tokenizer.kind must be llama3")


def force_len(tokenizer, text: str, n: int, trials: int = 3) -> str:
    """multi-turn.py's `force_len_tokens`: text that encodes to n ids, cut or padded with " a"."""
    (pad,) = tokenizer.encode(PAD_TEXT).tolist()

    def fit(ids) -> str:
        ids = list(ids)
        return tokenizer.decode(ids[:n] if len(ids) >= n else ids + [pad] * (n - len(ids)))

    out = fit(tokenizer.encode(text))
    for _ in range(trials):
        check = tokenizer.encode(out)
        if len(check) == n:
            break
        out = fit(check)
    return out


def pick_conversations(convs: list[list[tuple[str, str]]], a: dict) -> list[tuple[list[str], list[str]]]:
    """(user messages, the reply after each) of the first num_clients conversations with enough
    user messages, cut to the turn rotation. `convs`: [(role, content), ...] in file order."""
    out = []
    for conv in convs:
        users = [k for k, (role, _) in enumerate(conv) if role == "user"]
        if len(users) < a["min_user_turns"]:
            continue
        T = a["turns_per_client"][len(out) % len(a["turns_per_client"])]
        T = max(1, min(T, a["min_user_turns"]))  # their conv[:T] of a min_user_turns-long list
        msgs, replies = [], []
        for k in users[:T]:
            msgs.append(conv[k][1])
            nxt = conv[k + 1] if k + 1 < len(conv) else None
            replies.append(nxt[1] if nxt is not None and nxt[0] == "assistant" else "")
        out.append((msgs, replies))
        if len(out) == a["num_clients"]:
            break
    return out


def make_chat_pool(cfg: dict, tokenizer, picked, prov: dict) -> Pool:
    """One query per (conversation, turn): the templated history with 4-token replies."""
    a = cfg["artifact"]
    if len(picked) < a["num_clients"]:
        raise WorkloadError(
            f"only {len(picked)} conversations have >= {a['min_user_turns']} user messages; "
            f"the artifact needs {a['num_clients']} (their fallback stitches messages across conversations: not offered)"
        )
    b = PoolBuilder(tokenizer)
    eot = tokenizer.encode(EOT)
    head = b.segment("<|begin_of_text|>" + (LLAMA31_SYSTEM_BLOCK if a["system_block"] else ""))
    uh, ah = b.segment(USER_HEADER), b.segment(ASSISTANT_HEADER)
    lens = a["user_tokens"]
    for c, (msgs, replies) in enumerate(picked):
        n = lens[c % len(lens)]
        history = [head]
        for k, (msg, reply) in enumerate(zip(msgs, replies)):
            user = b.segment(force_len(tokenizer, msg, n).strip() + EOT)  # the template trims contents
            prompt = history + [uh, user, ah]
            gen, _ = generated_tokens(tokenizer.encode(reply.strip()), cfg["output_len"], tokenizer.eos_id)
            b.add_query(prompt, gen, group=c, conversation=c, turn=k)
            reply_seg = b.segment(tokenizer.decode(gen) + EOT, np.concatenate([gen, eot]))
            history = prompt + [reply_seg]
    prov.update({"conversations_used": len(picked), "turns": len(b), "filtered": {}})
    return b.build(prov)


def chat_requests(cfg: dict, pool: Pool, seed: int):
    a = cfg["artifact"]
    convs: dict[int, list[int]] = {}
    for q in range(len(pool)):
        convs.setdefault(pool.q_conversation[q], []).append(q)
    order = [convs[c] for c in sorted(convs)]
    plan = ClosedLoopPlan(
        conversations=tuple(tuple(c) for c in order),
        concurrency=int(a["concurrency"] or a["num_clients"]),
        poll_rate_per_s=float(cfg["request_rate"]),
        seed=int(component_rng(seed, "client").integers(2**63)),
        warmup=tuple(order[0][:1] * a["warmup_requests"]),
        start_gap_s=float(a["start_gap_s"]),
    )
    return universe(pool), plan


def sharegpt_roles(rows) -> list[list[tuple[str, str]]]:
    """multi-turn.py's `_load_sharegpt` on a JSON array: [(role, content), ...] per row."""
    out = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        raw = row.get("conversations") or row.get("messages") or []
        conv = []
        for m in raw if isinstance(raw, list) else []:
            if not isinstance(m, dict):
                continue
            role, content = m.get("role"), m.get("content")
            if role is None:
                frm = m.get("from", "")
                role = "user" if frm in ("human", "user") else ("assistant" if frm in ("gpt", "assistant") else frm)
                content = m.get("value")
            if role and isinstance(content, str):
                conv.append((role, content))
        if conv:
            out.append(conv)
    return out

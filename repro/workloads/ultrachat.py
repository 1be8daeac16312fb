"""UltraChat (multi-turn), from a local file, or a labelled synthetic stand-in.

Real formats (`path:` a file or a folder of them; default `$REPRO_DATA_DIR/ultrachat/`):
* raw UltraChat jsonl (HF `stingning/ultrachat`): one `{"id", "data": [u, a, u, a, ...]}`
  per line;
* `ultrachat_200k` parquet (HF `HuggingFaceH4/ultrachat_200k`): column `messages`, a
  list of `{"role", "content"}`.
As SGLang's `sample_ultrachat_requests`: conversations with < 2 messages or an odd
number are skipped; messages are paired (user, reply). Parquet rows must also start
with a user message and alternate user/assistant (else: malformed).

Stand-in (`source: synthetic`, or `auto` with no file): conversations with
1 + Poisson(mean_turns - 1) turns, user messages and replies of log-normal length with
mean `mean_utterance_tokens` (UltraChat's published 3.8 turns and ~309 tokens per
utterance), text drawn from the fixed word pool. Labelled `synthetic: true`.
"""

from __future__ import annotations

from pathlib import Path

from repro.workloads import cache as _cache
from repro.workloads import artifact_chat
from repro.workloads.arrivals import component_rng
from repro.workloads.base import DataSource, WorkloadError, WorkloadSpec, _Problems, default_data_dir
from repro.workloads.chat import ChatCounters, Turn, add_conversation, message_texts, reply_text
from repro.workloads.pool import Pool, PoolBuilder
from repro.workloads.sources import data_files, files_digest, iter_jsonl, missing_data, read_parquet_column
from repro.workloads.synthetic import lognormal_lengths, tokens_of_words_in, words_segment
from repro.workloads.tokenizer import chat_template

DATASET_ID = "stingning/ultrachat (raw jsonl) or HuggingFaceH4/ultrachat_200k (parquet)"
EXTS = (".jsonl", ".json", ".parquet")


def parse_raw_row(row) -> list[str] | None:
    if not isinstance(row, dict):
        return None
    data = row.get("data")
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        return None
    return data


def parse_messages(messages) -> list[str] | None:
    """ultrachat_200k `messages` -> [u, a, u, a, ...], or None if malformed."""
    if not isinstance(messages, list):
        return None
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            return None
        if m.get("role") != ("user" if k % 2 == 0 else "assistant"):
            return None
        out.append(m["content"])
    return out


class UltraChatWorkload(WorkloadSpec):
    name = "ultrachat"
    DEFAULTS = {
        "max_context_len": 16384,
        "min_tokens": 4,
        "max_turns": None,
        "stand_in": None,  # filled from STAND_IN_DEFAULTS
    }
    STAND_IN_DEFAULTS = {
        "mean_turns": 3.8,
        "mean_utterance_tokens": 309,
        "utterance_len_sigma": 0.6,
        "max_utterance_tokens": 4096,
    }

    def validate(self, p: _Problems) -> None:
        p.int_(self.cfg, "min_tokens", 0)
        p.int_(self.cfg, "max_turns", 1, allow_none=True)
        st = self.cfg["stand_in"]
        p.float_(st, "mean_turns", lo=1.0)
        p.float_(st, "mean_utterance_tokens", lo=1.0)
        p.float_(st, "utterance_len_sigma", lo=0.0)
        p.int_(st, "max_utterance_tokens", 1)

    ARTIFACT_DEFAULTS = artifact_chat.CHAT_ARTIFACT_DEFAULTS  # multi-turn.py (artifact_chat.py)

    def validate_artifact(self, p: _Problems) -> None:
        artifact_chat.validate_chat(p, self.cfg)
        self.validate(p)  # the stand-in's statistics are used too

    def make_artifact_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        a = self.cfg["artifact"]
        if data.kind == "real":
            convs, stats = self._read_real(data.path)
            roles = [[("user" if k % 2 == 0 else "assistant", m) for k, m in enumerate(c)] for c in convs]
            prov = {k: v for k, v in stats.items() if k in ("rows_read", "malformed_rows")}
        else:
            roles = self._artifact_stand_in(seed, tokenizer, a)
            prov = {"rows_read": 0, "malformed_rows": 0, "stand_in": dict(self.cfg["stand_in"])}
        picked = artifact_chat.pick_conversations(roles, a)
        return artifact_chat.make_chat_pool(self.cfg, tokenizer, picked, prov)

    def _artifact_stand_in(self, seed: int, tokenizer, a: dict) -> list[list[tuple[str, str]]]:
        """The stand-in's conversations in "file" order until num_clients have enough user turns;
        text is drawn for those only (the others are never read)."""
        st = self.cfg["stand_in"]
        rng = component_rng(seed, "ultrachat.artifact.stand_in")
        convs: list[list[tuple[str, str]]] = []
        drawn = 0
        while len(convs) < a["num_clients"]:
            drawn += 1
            if drawn > 10_000_000:
                raise WorkloadError("workload 'ultrachat': the stand-in settings yield no long enough conversations")
            n_turns = 1 + int(rng.poisson(st["mean_turns"] - 1.0))
            if n_turns < a["min_user_turns"]:
                continue
            lens = lognormal_lengths(
                rng, 2 * n_turns, st["mean_utterance_tokens"], st["utterance_len_sigma"], 1, st["max_utterance_tokens"]
            )
            conv = []
            for k in range(2 * n_turns):
                text, _ = words_segment(rng, int(lens[k]), tokenizer)
                conv.append(("user" if k % 2 == 0 else "assistant", text[:-1]))
            convs.append(conv)
        return convs

    def artifact_requests(self, pool: Pool, seed: int):
        return artifact_chat.chat_requests(self.cfg, pool, seed)

    def _path(self) -> Path:
        if self.cfg["path"] is not None:
            return Path(self.cfg["path"]).expanduser()
        return default_data_dir() / "ultrachat"

    def resolve_data(self) -> DataSource:
        if self.cfg["source"] == "synthetic":
            return DataSource(kind="synthetic", dataset_id=DATASET_ID, label="stand-in: UltraChat statistics")
        path = self._path()
        files = data_files(path, EXTS)
        if not files:
            # an explicit path that holds no data is a mistake, not a request for the stand-in
            if self.cfg["source"] == "real" or self.cfg["path"] is not None:
                raise missing_data(
                    "ultrachat",
                    path,
                    DATASET_ID,
                    "a raw UltraChat .jsonl or ultrachat_200k .parquet file, or a folder of them",
                )
            return DataSource(kind="synthetic", dataset_id=DATASET_ID, label="stand-in: UltraChat statistics")
        digest, size = files_digest(files, _cache.file_sha256)
        # default location labelled machine-independently (provenance goes into summaries)
        label = str(self.cfg["path"]) if self.cfg["path"] is not None else "$REPRO_DATA_DIR/ultrachat"
        return DataSource(kind="real", path=path, label=label, sha256=digest, size_bytes=size, dataset_id=DATASET_ID)

    # -- real ------------------------------------------------------------------------
    def _read_real(self, path: Path) -> tuple[list[list[str]], dict]:
        convs: list[list[str]] = []
        stats = {"rows_read": 0, "malformed_rows": 0, "conversations_too_short": 0, "conversations_odd_length": 0}
        for f in data_files(path, EXTS):
            if f.name.endswith(".parquet"):
                rows = [parse_messages(m) for m in read_parquet_column(f, "messages")]
            else:
                rows = []
                parsed_any = False
                for _, obj in iter_jsonl(f):
                    parsed_any = parsed_any or obj is not None
                    rows.append(parse_raw_row(obj) if obj is not None else None)
                if rows and not parsed_any:
                    raise WorkloadError(f"workload 'ultrachat': {f} has no parsable JSON line")
            for data in rows:
                stats["rows_read"] += 1
                if data is None:
                    stats["malformed_rows"] += 1
                elif len(data) < 2:
                    stats["conversations_too_short"] += 1
                elif len(data) % 2:
                    stats["conversations_odd_length"] += 1
                else:
                    convs.append(data)
        return convs, stats

    def make_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        c = self.cfg
        b = PoolBuilder(tokenizer)
        counters = ChatCounters()
        common = dict(
            output_len=c["output_len"],
            eos_id=tokenizer.eos_id,
            max_context_len=c["max_context_len"],
            min_tokens=c["min_tokens"],
            min_reply_tokens=c["min_tokens"],
            counters=counters,
            max_turns=c["max_turns"],
        )
        prov: dict = {}
        if data.kind == "real":
            convs, stats = self._read_real(data.path)
            if not convs:
                raise WorkloadError(f"workload 'ultrachat': no usable conversation in {data.path} ({stats})")
            sampled = 0
            for ci in component_rng(seed, "sample").permutation(len(convs)).tolist():
                if len(b) >= c["num_queries"]:
                    break
                msgs = convs[ci]
                turns = [Turn([msgs[i]], msgs[i + 1]) for i in range(0, len(msgs), 2)]
                cid = counters.conversations_used
                sampled += 1
                add_conversation(b, turns, group_id=cid, conversation_id=cid, **common)
            prov.update({k: v for k, v in stats.items() if k in ("rows_read", "malformed_rows")})
            prov["usable_conversations"] = len(convs)
            prov["conversations_sampled"] = sampled
            prov["filtered"] = {
                "conversations_too_short": stats["conversations_too_short"],
                "conversations_odd_length": stats["conversations_odd_length"],
                **counters.as_dict(),
            }
        else:
            st = c["stand_in"]
            rng = component_rng(seed, "ultrachat.stand_in")
            template = chat_template(tokenizer)
            attempts = 0
            while len(b) < c["num_queries"]:
                attempts += 1
                if attempts > 100 * c["num_queries"] + 1000:
                    raise WorkloadError("workload 'ultrachat': the stand-in settings yield no usable turns")
                n_turns = 1 + int(rng.poisson(st["mean_turns"] - 1.0))
                lens = lognormal_lengths(
                    rng,
                    2 * n_turns,
                    st["mean_utterance_tokens"],
                    st["utterance_len_sigma"],
                    1,
                    st["max_utterance_tokens"],
                )
                turns = []
                for t in range(n_turns):
                    user, user_ids = words_segment(rng, int(lens[2 * t]), tokenizer)
                    reply, reply_ids = words_segment(rng, int(lens[2 * t + 1]), tokenizer)
                    turns.append(Turn([user[:-1]], reply[:-1]))  # chat.py adds the newline
                    # their segments' tokens without BPE over the words
                    for seg, words, ids in (
                        (message_texts([user[:-1]], template)[0], user, user_ids),
                        (reply_text(reply[:-1], template), reply, reply_ids),
                    ):
                        b.give_tokens(seg, tokens_of_words_in(tokenizer, seg, words[:-1], ids[:-1]))
                cid = counters.conversations_used
                add_conversation(b, turns, group_id=cid, conversation_id=cid, **common)
            prov.update({"rows_read": 0, "malformed_rows": 0, "stand_in": dict(st), "filtered": counters.as_dict()})
        return b.build(prov)

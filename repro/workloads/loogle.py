"""LooGLE (long-document QA), from a local jsonl file, or a labelled synthetic stand-in.

Real format (HF `bigainlco/LooGLE`, configs `shortdep_qa` / `longdep_qa`; default file
`$REPRO_DATA_DIR/loogle/<config>.jsonl`): one row per document,
`{"input": document, "title": ..., "qa_pairs": "[{'Q': ..., 'A': ..., 'S': ...}, ...]"}`
where `qa_pairs` is a string holding a Python/JSON list literal (parsed with
`ast.literal_eval`, never `eval`); rows whose qa_pairs is "none" or empty have no
questions (counted, not malformed).

Modes (prompt text as SGLang's hicache LooGLE benchmark: "Input: <doc>" then
"Question: <Q>"):
* `shared_prefix` (default, the paper's setting): every question is its own one-turn
  request, prompt = document + question; the document is the shared prefix; group =
  document.
* `follow_up`: one conversation per document: turn 0 = document + first question,
  turn k = the k-th question appended after the earlier answers.
Filters as SGLang: question prompts need >= `min_tokens` tokens; answers are not
length-filtered (short answers are EOS-padded to output_len, counted).

Documents are sampled without replacement in a seeded random order, all their
questions taken, until the questions reach `num_queries`.

Stand-in (`source: synthetic`, or `auto` with no file): documents of uniform
length in `doc_tokens_range` (LooGLE: ~21k-36k tokens) with a uniform number of
questions in `questions_per_doc_range` (6-16), questions and answers of uniform
length in their ranges; text from the fixed word pool. Labelled `synthetic: true`.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from repro.workloads import cache as _cache
from repro.workloads import artifact_loogle
from repro.workloads.arrivals import component_rng
from repro.workloads.base import DataSource, WorkloadError, WorkloadSpec, _Problems, default_data_dir
from repro.workloads.chat import ChatCounters, Turn, add_conversation, message_texts
from repro.workloads.pool import Pool, PoolBuilder
from repro.workloads.sources import iter_jsonl, missing_data
from repro.workloads.synthetic import tokens_of_words_in, words_segment
from repro.workloads.tokenizer import chat_template

DATASET_ID = "bigainlco/LooGLE"
MODES = ("shared_prefix", "follow_up")
CONFIGS = ("shortdep_qa", "longdep_qa")


def parse_qa_pairs(value) -> list[tuple[str, str]] | None:
    """[(Q, A), ...]; [] for a row without questions; None if malformed."""
    if isinstance(value, str):
        s = value.strip()
        if s in ("", "none", "None", "[]"):
            return []
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            try:
                value = json.loads(s)
            except ValueError:
                return None
    if value is None:
        return []
    if not isinstance(value, list):
        return None
    out = []
    for qa in value:
        if not isinstance(qa, dict) or not isinstance(qa.get("Q"), str) or not isinstance(qa.get("A"), str):
            return None
        out.append((qa["Q"], qa["A"]))
    return out


class LooGLEWorkload(WorkloadSpec):
    name = "loogle"
    DEFAULTS = {
        "max_context_len": 131072,  # Llama-3.1's context window
        "mode": "shared_prefix",
        "config": "longdep_qa",
        "min_tokens": 4,
        "stand_in": None,
    }
    STAND_IN_DEFAULTS = {
        "doc_tokens_range": [21000, 36000],
        "questions_per_doc_range": [6, 16],
        "question_tokens_range": [8, 40],
        "answer_tokens_range": [4, 64],
    }

    def validate(self, p: _Problems) -> None:
        p.choice(self.cfg, "mode", MODES)
        p.choice(self.cfg, "config", CONFIGS)
        p.int_(self.cfg, "min_tokens", 0)
        st = self.cfg["stand_in"]
        for k in self.STAND_IN_DEFAULTS:
            p.int_range(st, k, minimum=1)

    ARTIFACT_DEFAULTS = artifact_loogle.LOOGLE_ARTIFACT_DEFAULTS  # long.py as long.sh calls it

    def validate_artifact(self, p: _Problems) -> None:
        self.validate(p)
        artifact_loogle.validate_loogle(p, self.cfg)

    def make_artifact_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        a = self.cfg["artifact"]
        rng = component_rng(seed, "loogle.artifact.sample")
        if data.kind == "real":
            docs, stats = self._read_real(data.path)
            if not docs:
                raise WorkloadError(f"workload 'loogle': no document with questions in {data.path} ({stats})")
            prov = {k: stats[k] for k in ("rows_read", "malformed_rows")}
            prov["usable_documents"] = len(docs)
        else:
            stream = self._stand_in_docs(component_rng(seed, "loogle.artifact.stand_in"), tokenizer)
            docs = [(doc, qas) for doc, qas, _ in (next(stream) for _ in range(a["stand_in_documents"]))]
            prov = {"rows_read": 0, "malformed_rows": 0, "stand_in": dict(self.cfg["stand_in"])}
        return artifact_loogle.make_loogle_pool(
            self.cfg, artifact_loogle.choose_documents(docs, a, rng), tokenizer, prov
        )

    def artifact_requests(self, pool: Pool, seed: int):
        return artifact_loogle.loogle_requests(self.cfg, pool, seed)

    def _path(self) -> Path:
        if self.cfg["path"] is not None:
            return Path(self.cfg["path"]).expanduser()
        return default_data_dir() / "loogle" / f"{self.cfg['config']}.jsonl"

    def resolve_data(self) -> DataSource:
        stand_in = DataSource(kind="synthetic", dataset_id=DATASET_ID, label="stand-in: LooGLE statistics")
        if self.cfg["source"] == "synthetic":
            return stand_in
        path = self._path()
        if not path.is_file():
            # an explicit path that holds no data is a mistake, not a request for the stand-in
            if self.cfg["source"] == "real" or self.cfg["path"] is not None:
                raise missing_data(
                    "loogle",
                    path,
                    f"{DATASET_ID}, config {self.cfg['config']}",
                    f"the {self.cfg['config']} split as jsonl, one document per line",
                )
            return stand_in
        # default location labelled machine-independently (provenance goes into summaries)
        label = (
            str(self.cfg["path"])
            if self.cfg["path"] is not None
            else f"$REPRO_DATA_DIR/loogle/{self.cfg['config']}.jsonl"
        )
        return DataSource(
            kind="real",
            path=path,
            label=label,
            sha256=_cache.file_sha256(path),
            size_bytes=path.stat().st_size,
            dataset_id=f"{DATASET_ID} ({self.cfg['config']})",
        )

    def _read_real(self, path: Path) -> tuple[list[tuple[str, list[tuple[str, str]]]], dict]:
        docs = []
        stats = {"rows_read": 0, "malformed_rows": 0, "documents_without_questions": 0}
        parsed_any = False
        for _, row in iter_jsonl(path):
            stats["rows_read"] += 1
            parsed_any = parsed_any or row is not None
            qa = None
            if isinstance(row, dict) and isinstance(row.get("input"), str):
                qa = parse_qa_pairs(row.get("qa_pairs"))
            if qa is None:
                stats["malformed_rows"] += 1
            elif not qa:
                stats["documents_without_questions"] += 1
            else:
                docs.append((row["input"], qa))
        if stats["rows_read"] and not parsed_any:
            raise WorkloadError(f"workload 'loogle': {path} has no parsable JSON line")
        return docs, stats

    def _stand_in_docs(self, rng, tokenizer):
        """Endless stream of synthetic (document, [(Q, A), ...], the document's word ids)."""
        st = self.cfg["stand_in"]

        def draw(key):
            lo, hi = st[key]
            return int(rng.integers(lo, hi + 1))

        while True:
            doc, doc_ids = words_segment(rng, draw("doc_tokens_range") - 1, tokenizer)
            qas = []
            for _ in range(draw("questions_per_doc_range")):
                q, _ = words_segment(rng, draw("question_tokens_range") - 1, tokenizer)
                a, _ = words_segment(rng, draw("answer_tokens_range") - 1, tokenizer)
                qas.append((q[:-1] + "?", a[:-1]))
            yield doc[:-1], qas, doc_ids[:-1]  # less the "\n"

    def make_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        c = self.cfg
        b = PoolBuilder(tokenizer)
        counters = ChatCounters()
        common = dict(
            output_len=c["output_len"],
            eos_id=tokenizer.eos_id,
            max_context_len=c["max_context_len"],
            min_tokens=c["min_tokens"],
            min_reply_tokens=None,
            counters=counters,
        )
        prov: dict = {"mode": c["mode"]}
        if data.kind == "real":
            docs, stats = self._read_real(data.path)
            if not docs:
                raise WorkloadError(f"workload 'loogle': no document with questions in {data.path} ({stats})")
            stream = ((*docs[i], None) for i in component_rng(seed, "sample").permutation(len(docs)).tolist())
            prov.update(
                {
                    "rows_read": stats["rows_read"],
                    "malformed_rows": stats["malformed_rows"],
                    "usable_documents": len(docs),
                }
            )
            filtered = {"documents_without_questions": stats["documents_without_questions"]}
        else:
            stream = self._stand_in_docs(component_rng(seed, "loogle.stand_in"), tokenizer)
            prov.update({"rows_read": 0, "malformed_rows": 0, "stand_in": dict(c["stand_in"])})
            filtered = {}
        n_docs = 0
        next_conv = 0
        template = chat_template(tokenizer)
        for doc, qas, doc_ids in stream:
            if len(b) >= c["num_queries"]:
                break
            doc_part = "Input: " + doc
            if doc_ids is not None:  # the stand-in's document segment, without BPE over its words
                seg = message_texts([doc_part, ""], template)[0]
                b.give_tokens(seg, tokens_of_words_in(tokenizer, seg, doc, doc_ids))
            before = len(b)
            if c["mode"] == "shared_prefix":
                for q, a in qas:
                    if add_conversation(
                        b, [Turn([doc_part, "Question: " + q], a)], group_id=n_docs, conversation_id=next_conv, **common
                    ):
                        next_conv += 1
            else:
                turns = [Turn([doc_part, "Question: " + qas[0][0]], qas[0][1])]
                turns += [Turn(["Question: " + q], a) for q, a in qas[1:]]
                if add_conversation(b, turns, group_id=n_docs, conversation_id=n_docs, **common):
                    next_conv += 1
            if len(b) > before:
                n_docs += 1
        prov["documents_used"] = n_docs
        prov["filtered"] = {**filtered, **counters.as_dict()}
        return b.build(prov)

"""A tokenised query pool: deduplicated text segments + queries that reference them.

Every workload builds a `Pool`: the unordered set of queries it will serve, each
prompt a sequence of segment ids (system prompt, document, message, role header ...).
A segment shared by many prompts (a GSP system prompt, a LooGLE document, a
conversation's history) is tokenised and stored once, which keeps the disk cache
small and makes shared prefixes identical arrays by construction.

Order, the `num_queries` cap and arrival times are applied afterwards (base.py), so
one cached pool serves every request rate and both orders.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np


class PieceTexts:
    """Segment texts kept as indices into a list of distinct pieces: segment i's text is the
    join of pieces[idx[start[i]:end[i]]], built on access. GSP's built-in-tokenizer text is
    made of one fixed word pool, so 2 bytes per word stand in for the word's ~6 characters
    (issue 20: a request's text is built when the router asks for it, not stored)."""

    __slots__ = ("pieces", "idx", "start", "end", "_lookup")

    def __init__(self, pieces: Sequence[str], idx: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        if len(pieces) > np.iinfo(idx.dtype).max + 1 or idx.dtype.kind != "u":
            raise ValueError(f"pool: {len(pieces)} pieces do not fit piece indices of type {idx.dtype}")
        if len(start) != len(end):
            raise ValueError("pool: piece texts have unequal start and end columns")
        self.pieces = list(pieces)
        self.idx, self.start, self.end = idx, start, end
        self._lookup = np.array(self.pieces, dtype=object)  # one take + join per text: ~1.8 us for 128 pieces

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> str:
        return "".join(self._lookup.take(self.idx[self.start[i] : self.end[i]]).tolist())

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        if not isinstance(other, (PieceTexts, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def segment_pieces(self, i: int) -> np.ndarray:
        return self.idx[self.start[i] : self.end[i]]


@dataclass
class Pool:
    seg_tokens: list[np.ndarray]  # int32 ids of each unique segment
    seg_texts: list[str] | PieceTexts | None  # its text (None: the workload has no text)
    q_segments: list[tuple[int, ...]]  # prompt = concatenation of these segments
    q_generated: list[np.ndarray]  # int32, exactly the query's output length
    q_group: list[int]
    q_conversation: list[int]
    q_turn: list[int]
    provenance: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.q_segments)

    def prompt_key(self, i: int) -> bytes:
        """Query i's prompt as a token key (`repro.kvcache.as_key` of its ids): its segments' bytes joined."""
        seg_tokens = self.seg_tokens
        return b"".join([seg_tokens[s].tobytes() for s in self.q_segments[i]])

    def prompt_tokens(self, i: int) -> np.ndarray:
        """Read-only int32 ids of query i's prompt, built afresh (a view of `prompt_key(i)`)."""
        return np.frombuffer(self.prompt_key(i), dtype=np.int32)

    def prompt_text(self, i: int) -> str | None:
        texts = self.seg_texts
        if texts is None:
            return None
        if texts.__class__ is not PieceTexts:
            return "".join([texts[s] for s in self.q_segments[i]])
        shared = self.__dict__.get("_shared_text")
        if shared is None:
            shared = self._keep_shared_texts()
        parts = []
        for s in self.q_segments[i]:
            text = shared.get(s)
            parts.append(texts[s] if text is None else text)
        return "".join(parts)

    def __post_init__(self) -> None:
        if isinstance(self.seg_texts, PieceTexts):
            self._keep_shared_texts()

    def _keep_shared_texts(self) -> dict[int, str]:
        """PieceTexts: the texts of segments more than one query uses (a system prompt: shared
        data) are built with the pool and kept; a query's own segments (its question) are
        joined each time its text is asked for and not kept."""
        uses = Counter(s for segs in self.q_segments for s in segs)
        texts = self.seg_texts
        shared = self.__dict__["_shared_text"] = {s: texts[s] for s, n in uses.items() if n > 1}
        return shared

    def prompt_len(self, i: int) -> int:
        lens = self.__dict__.get("_q_len")
        if lens is None:  # every query's, once (a validation pass asks all of them)
            seg_len = [len(t) for t in self.seg_tokens]
            lens = self.__dict__["_q_len"] = [sum([seg_len[s] for s in segs]) for segs in self.q_segments]
        return lens[i]

    # -- serialisation (an .npz archive, written and read one array at a time) ------
    # The cache adds a checksum header (cache.py). Streaming keeps a million-query pool's
    # write and load at about one array's worth of memory above the pool itself, where a
    # bytes payload held the pool two to three times over.
    def write(self, f) -> None:
        """Write the pool as an .npz archive to the binary file object `f` (need not be seekable)."""
        seg_len = np.array([len(t) for t in self.seg_tokens], dtype=np.int64)
        arrays = {
            "seg_tok": lambda: _concat_i32(self.seg_tokens),
            "seg_off": lambda: _offsets(seg_len),
            "q_seg": lambda: np.array([s for segs in self.q_segments for s in segs], dtype=np.int32),
            "q_seg_off": lambda: _offsets(np.array([len(s) for s in self.q_segments], dtype=np.int64)),
            "q_gen": lambda: _concat_i32(self.q_generated),
            "q_gen_off": lambda: _offsets(np.array([len(g) for g in self.q_generated], dtype=np.int64)),
            "q_group": lambda: np.asarray(self.q_group, dtype=np.int64),
            "q_conv": lambda: np.asarray(self.q_conversation, dtype=np.int64),
            "q_turn": lambda: np.asarray(self.q_turn, dtype=np.int64),
            "provenance": lambda: np.frombuffer(json.dumps(self.provenance, sort_keys=True).encode(), dtype=np.uint8),
        }
        # through a non-seekable writer whatever `f` is: zipfile then streams (data descriptors,
        # no seeking back), and the bytes never depend on the kind of file
        with zipfile.ZipFile(_Forward(f), "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            _write_members(zf, arrays)
            if isinstance(self.seg_texts, PieceTexts):
                self._write_piece_texts(zf)
            elif self.seg_texts is not None:
                texts = self.seg_texts
                text_len = np.array([len(t) if t.isascii() else len(_utf8(t)) for t in texts], dtype=np.int64)
                _write_members(zf, {"seg_text_off": lambda: _offsets(text_len)})
                _write_chunked(
                    zf,
                    "seg_text",
                    "|u1",
                    int(text_len.sum()),  # the text blob, a chunk at a time
                    (_utf8("".join(texts[i : i + 4096])) for i in range(0, len(texts), 4096)),
                )

    def _write_piece_texts(self, zf: zipfile.ZipFile) -> None:
        """The pieces (as a text blob) and each segment's piece indices, in segment order."""
        t = self.seg_texts
        piece_len = np.array([len(_utf8(p)) for p in t.pieces], dtype=np.int64)
        seg_n = (t.end - t.start).astype(np.int64)
        arrays = {
            "piece_text_off": lambda: _offsets(piece_len),
            "piece_text": lambda: np.frombuffer(_utf8("".join(t.pieces)), dtype=np.uint8),
            "seg_piece_off": lambda: _offsets(seg_n),
        }
        _write_members(zf, arrays)
        _write_chunked(
            zf,
            "seg_piece",
            t.idx.dtype.str,
            int(seg_n.sum()),  # a chunk of segments at a time
            (
                b"".join([t.segment_pieces(j).tobytes() for j in range(i, min(i + 4096, len(t)))])
                for i in range(0, len(t), 4096)
            ),
        )

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        self.write(buf)
        return buf.getvalue()

    @classmethod
    def read(cls, f) -> "Pool":
        """The pool in the .npz archive open as the seekable binary file `f` (data before it is skipped)."""
        with zipfile.ZipFile(f) as zf:
            names = {n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")}

            def get(name: str) -> np.ndarray:
                with zf.open(name + ".npy") as member:
                    return np.lib.format.read_array(member, allow_pickle=False)

            seg_tok, seg_off = get("seg_tok"), get("seg_off").tolist()
            seg_tokens = [seg_tok[seg_off[i] : seg_off[i + 1]] for i in range(len(seg_off) - 1)]
            seg_texts = None
            if "seg_text" in names:
                off = get("seg_text_off").tolist()
                blob = memoryview(get("seg_text"))
                seg_texts = [str(blob[off[i] : off[i + 1]], "utf-8", "surrogatepass") for i in range(len(off) - 1)]
                del blob
            elif "seg_piece" in names:
                off = get("piece_text_off").tolist()
                blob = memoryview(get("piece_text"))
                pieces = [str(blob[off[i] : off[i + 1]], "utf-8", "surrogatepass") for i in range(len(off) - 1)]
                del blob
                seg_off = get("seg_piece_off")
                seg_texts = PieceTexts(pieces, get("seg_piece"), seg_off[:-1], seg_off[1:])
            q_seg, q_off = get("q_seg").tolist(), get("q_seg_off").tolist()
            q_segments = [tuple(q_seg[q_off[i] : q_off[i + 1]]) for i in range(len(q_off) - 1)]
            gen, goff = get("q_gen"), get("q_gen_off").tolist()
            q_generated = [gen[goff[i] : goff[i + 1]] for i in range(len(goff) - 1)]
            pool = cls(
                seg_tokens=seg_tokens,
                seg_texts=seg_texts,
                q_segments=q_segments,
                q_generated=q_generated,
                q_group=get("q_group").tolist(),
                q_conversation=get("q_conv").tolist(),
                q_turn=get("q_turn").tolist(),
                provenance=json.loads(get("provenance").tobytes().decode()),
            )
        pool.check()
        return pool

    @classmethod
    def from_bytes(cls, data: bytes) -> "Pool":
        return cls.read(io.BytesIO(data))

    def check(self) -> None:
        """Structural invariants (a cache file that passes its checksum but not this is rejected)."""
        n = len(self.q_segments)
        if not (len(self.q_generated) == len(self.q_group) == len(self.q_conversation) == len(self.q_turn) == n):
            raise ValueError("pool: per-query columns differ in length")
        if self.seg_texts is not None and len(self.seg_texts) != len(self.seg_tokens):
            raise ValueError("pool: segment texts and tokens differ in count")
        if isinstance(self.seg_texts, PieceTexts):
            t = self.seg_texts
            if len(t.idx) and int(t.idx.max()) >= len(t.pieces):
                raise ValueError("pool: a segment text refers to a missing piece")
            if len(t) and (int(t.start.min()) < 0 or bool((t.end < t.start).any()) or int(t.end.max()) > len(t.idx)):
                raise ValueError("pool: a segment text's piece range is out of bounds")
        nseg = len(self.seg_tokens)
        if any(t.dtype != np.int32 for t in self.seg_tokens) or any(g.dtype != np.int32 for g in self.q_generated):
            raise ValueError("pool: token ids must be int32 arrays")
        for segs in self.q_segments:
            if not segs or min(segs) < 0 or max(segs) >= nseg:
                raise ValueError("pool: query references a missing segment")


class PoolBuilder:
    """Collects segments (deduplicated by text) and queries while a workload is built."""

    def __init__(self, tokenizer, with_text: bool = True):
        self.tokenizer = tokenizer
        self.with_text = with_text
        self._seg_index: dict[tuple, int] = {}
        self.seg_tokens: list[np.ndarray] = []
        self.seg_texts: list[str] = []
        self.q_segments: list[tuple[int, ...]] = []
        self.q_generated: list[np.ndarray] = []
        self.q_group: list[int] = []
        self.q_conversation: list[int] = []
        self.q_turn: list[int] = []
        self._prefetched: dict[str, np.ndarray] = {}

    def prefetch(self, texts) -> None:
        """Tokenise the texts not seen yet in one batch call (threads with Llama-3's tokenizer);
        `segment` then takes their tokens from here. Same ids as one-by-one encoding."""
        todo = list(dict.fromkeys(t for t in texts if (t, None) not in self._seg_index and t not in self._prefetched))
        if todo:
            self._prefetched.update(zip(todo, self.tokenizer.encode_batch(todo)))

    def give_tokens(self, text: str, tokens: np.ndarray | None) -> None:
        """The tokens `segment(text)` would compute, known by construction (a stand-in's word
        ids; None: not known): taken like prefetched ones, so the segment's identity is unchanged."""
        if tokens is not None and (text, None) not in self._seg_index:
            self._prefetched[text] = np.ascontiguousarray(tokens, dtype=np.int32)

    def segment(self, text: str, tokens: np.ndarray | None = None) -> int:
        """Id of the segment with this text (tokenised on first sight unless `tokens` given).

        Given tokens are part of the identity: two id sequences that decode to the same
        text (possible with an HF tokenizer) stay two segments.
        """
        if tokens is not None:
            tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        key = (text, None if tokens is None else tokens.tobytes())
        sid = self._seg_index.get(key)
        if sid is None:
            if tokens is None:
                pre = self._prefetched.pop(text, None)
                tokens = np.ascontiguousarray(self.tokenizer.encode(text) if pre is None else pre, dtype=np.int32)
            sid = len(self.seg_tokens)
            self._seg_index[key] = sid
            self.seg_tokens.append(tokens)
            self.seg_texts.append(text)
        return sid

    def seg_len(self, sid: int) -> int:
        return int(len(self.seg_tokens[sid]))

    def add_query(self, segments, generated: np.ndarray, group: int, conversation: int, turn: int) -> None:
        self.q_segments.append(tuple(int(s) for s in segments))
        self.q_generated.append(np.ascontiguousarray(generated, dtype=np.int32))
        self.q_group.append(int(group))
        self.q_conversation.append(int(conversation))
        self.q_turn.append(int(turn))

    def __len__(self) -> int:
        return len(self.q_segments)

    def build(self, provenance: dict) -> Pool:
        # drop segments no query uses (e.g. turns filtered out after tokenising)
        used = sorted({s for segs in self.q_segments for s in segs})
        remap = {old: new for new, old in enumerate(used)}
        pool = Pool(
            seg_tokens=[self.seg_tokens[s] for s in used],
            seg_texts=[self.seg_texts[s] for s in used] if self.with_text else None,
            q_segments=[tuple(remap[s] for s in segs) for segs in self.q_segments],
            q_generated=list(self.q_generated),
            q_group=list(self.q_group),
            q_conversation=list(self.q_conversation),
            q_turn=list(self.q_turn),
            provenance=dict(provenance),
        )
        pool.check()
        return pool


def generated_tokens(reply_tokens: np.ndarray, output_len: int, eos_id: int) -> tuple[np.ndarray, bool]:
    """First `output_len` tokens of the recorded reply, padded with EOS if the reply is shorter.

    Returns (tokens, padded). Padding (rather than dropping short replies) keeps the set
    of queries independent of `output_len`, so an output-length sweep changes one thing.
    """
    head = np.asarray(reply_tokens[:output_len], dtype=np.int32)
    if len(head) == output_len:
        return head, False
    pad = np.full(output_len - len(head), eos_id, dtype=np.int32)
    return np.concatenate([head, pad]), True


class _Forward(io.RawIOBase):
    """Write-only, not seekable: passes writes on to `f`."""

    def __init__(self, f):
        self.f, self.pos = f, 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = self.f.write(b)
        self.pos += n
        return n

    def tell(self) -> int:
        return self.pos


def _write_members(zf: zipfile.ZipFile, arrays: dict) -> None:
    """Each array, made only when its turn comes, as one .npy member."""
    for name, make in arrays.items():
        with zf.open(_member(name), "w", force_zip64=True) as out:
            np.lib.format.write_array(out, make(), allow_pickle=False)


def _write_chunked(zf: zipfile.ZipFile, name: str, descr: str, length: int, chunks) -> None:
    """A 1-d .npy member of `length` items of dtype `descr`, written from an iterable of byte chunks."""
    with zf.open(_member(name), "w", force_zip64=True) as out:
        np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": (length,)})
        for chunk in chunks:
            out.write(chunk)


def _member(name: str) -> zipfile.ZipInfo:
    return zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))  # fixed: same pool, same bytes


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _concat_i32(arrays: list[np.ndarray]) -> np.ndarray:
    if not arrays:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate(arrays, dtype=np.int32, casting="unsafe")  # as np.asarray(a, int32) did


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

"""Requests that refer to their pool (request.py) and GSP's numpy pool builder (gsp.py).

References: the eager per-request concatenation requests used to hold, and GSP's
per-segment `words_segment` loop, both written out here.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wl_helpers import wl_cfg

from repro.kvcache import as_key
from repro.workloads import Request, build_workload, resolve_spec
from repro.workloads.arrivals import component_rng
from repro.workloads.pool import PieceTexts, Pool, PoolBuilder
from repro.workloads.synthetic import words_segment
from repro.workloads.tokenizer import make_tokenizer


@st.composite
def pools(draw):
    n_seg = draw(st.integers(1, 6))
    seg_tokens = [np.array(draw(st.lists(st.integers(0, 2**31 - 1), max_size=5)), dtype=np.int32)
                  for _ in range(n_seg)]
    with_text = draw(st.booleans())
    seg_texts = [draw(st.text(max_size=4)) for _ in range(n_seg)] if with_text else None
    n_q = draw(st.integers(1, 6))
    q_segments = [tuple(draw(st.lists(st.integers(0, n_seg - 1), min_size=1, max_size=4))) for _ in range(n_q)]
    q_generated = [np.array(draw(st.lists(st.integers(0, 99), min_size=1, max_size=3)), dtype=np.int32)
                   for _ in range(n_q)]
    return Pool(seg_tokens, seg_texts, q_segments, q_generated, list(range(n_q)), list(range(n_q)), [0] * n_q)


@settings(max_examples=200, deadline=None)
@given(pools(), st.data())
def test_pool_request_equals_the_eager_concatenation(pool, data):
    q = data.draw(st.integers(0, len(pool) - 1))
    r = Request.from_pool(pool, q, id=7, arrival_s=1.5, generated_tokens=pool.q_generated[q])
    eager = np.concatenate([pool.seg_tokens[s] for s in pool.q_segments[q]]).astype(np.int32)
    text = None if pool.seg_texts is None else "".join(pool.seg_texts[s] for s in pool.q_segments[q])
    assert r.prompt_tokens.dtype == np.int32 and np.array_equal(r.prompt_tokens, eager)
    assert not r.prompt_tokens.flags.writeable
    assert r.prompt_len == len(eager) and r.text == text
    assert r.prompt_key == as_key(eager) == Request(0, 0.0, eager, 1, np.zeros(1, np.int32), 0, 0, 0).prompt_key
    assert np.array_equal(r.full_tokens, np.concatenate([eager, pool.q_generated[q]]))
    assert (r.output_len, r.group_id, r.conversation_id, r.turn) == (len(pool.q_generated[q]), q, q, 0)
    # pickled / replaced: a plain request with the same content, the pool left behind
    for other in (pickle.loads(pickle.dumps(r)), dataclasses.replace(r, arrival_s=2.0)):
        assert other._pool is None and np.array_equal(other.prompt_tokens, eager) and other.text == text
    assert dataclasses.replace(r, arrival_s=2.0).arrival_s == 2.0 and r.arrival_s == 1.5


def test_request_stays_frozen_and_checks_its_output_len():
    r = Request(0, 0.0, np.arange(3, dtype=np.int32), 1, np.zeros(1, np.int32), 0, 0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.arrival_s = 1.0
    with pytest.raises(ValueError, match="output_len"):
        Request(0, 0.0, np.arange(3, dtype=np.int32), 2, np.zeros(1, np.int32), 0, 0, 0)


def test_requests_keep_no_prompt_of_their_own():
    wl = build_workload(wl_cfg("gsp", num_queries=32, num_groups=2, prompts_per_group=16), seed=0, use_cache=False)
    r = wl.requests[0]
    assert r._prompt is None and r._text is None and r._pool is not None
    assert r.prompt_tokens is not r.prompt_tokens  # built on access, not cached


def _loop_pool(spec, seed):
    """GSP's pool as it was built before the numpy builder: one words_segment per segment."""
    c = spec.cfg
    tok = make_tokenizer(c["tokenizer"])
    G, P = c["num_groups"], spec.prompts_per_group()
    sys_lens, q_lens, out_lens = spec.draw_lengths(seed)  # the lengths are not what this reference checks
    rng = component_rng(seed, "gsp.tokens")
    b = PoolBuilder(tok)
    for g in range(G):
        s = b.segment(*words_segment(rng, int(sys_lens[g]) - 1, tok))
        for j in range(P):
            q = b.segment(*words_segment(rng, int(q_lens[g, j]) - 1, tok))
            _, toks = words_segment(rng, int(out_lens[g, j]), tok)
            b.add_query([s, q], toks[:-1], group=g, conversation=g * P + j, turn=0)
    mean = float(np.mean([b.seg_len(b.q_segments[g * P][0]) for g in range(G)]))
    return b.build({"rows_read": 0, "malformed_rows": 0, "num_groups": G, "prompts_per_group": P,
                    "system_prompt_tokens_mean": mean, "filtered": {}})


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 40), st.integers(1, 6), st.integers(1, 5),
       st.sampled_from([1.0, 0.5, 0.0]), st.sampled_from([None, [1, 30]]), st.sampled_from([None, 0.5, 0.97]),
       st.integers(0, 3))
def test_gsp_numpy_pool_equals_the_segment_loop(G, P, sys_len, q_len, out_len, rr, sys_range, ratio, seed):
    # short lengths on purpose: one-token segments ("\n" only) repeat, so deduplication is exercised
    spec = resolve_spec(wl_cfg("gsp", num_queries=G * P, num_groups=G, prompts_per_group=P,
                               system_prompt_len=sys_len, question_len=q_len, output_len=out_len,
                               range_ratio=rr, system_prompt_len_range=sys_range, shared_prefix_ratio=ratio))
    got = spec.make_pool(seed, make_tokenizer(spec.cfg["tokenizer"]), None)
    want = _loop_pool(spec, seed)
    assert isinstance(got.seg_texts, PieceTexts) and isinstance(want.seg_texts, list)
    assert _pools_equal(got, want) and list(got.seg_texts) == want.seg_texts
    assert list(got.provenance) == list(want.provenance)
    assert all(got.prompt_text(q) == want.prompt_text(q) for q in range(len(got)))


def test_gsp_numpy_pool_equals_the_segment_loop_at_default_lengths():
    spec = resolve_spec(wl_cfg("gsp", num_queries=256, num_groups=16, prompts_per_group=16))
    got = spec.make_pool(0, make_tokenizer(spec.cfg["tokenizer"]), None)
    want = _loop_pool(spec, 0)
    assert _pools_equal(got, want) and all(got.prompt_text(q) == want.prompt_text(q) for q in range(len(got)))


def _pools_equal(a: Pool, b: Pool) -> bool:
    same = lambda x, y: len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y))  # noqa: E731
    return (same(a.seg_tokens, b.seg_tokens) and a.seg_texts == b.seg_texts and a.q_segments == b.q_segments
            and same(a.q_generated, b.q_generated) and (a.q_group, a.q_conversation, a.q_turn, a.provenance)
            == (b.q_group, b.q_conversation, b.q_turn, b.provenance))


@st.composite
def texted_pools(draw):
    pool = draw(pools())
    # non-ASCII and lone surrogates too (the cache writes text with surrogatepass)
    alphabet = st.sampled_from(["a", " ", "\n", "é", "日", "\ud800", "🙂"])
    pool.seg_texts = [draw(st.text(alphabet, max_size=6)) for _ in pool.seg_tokens]
    pool.provenance = {"k": draw(st.integers())}
    return pool


@st.composite
def piece_pools(draw):
    """Pools whose texts are PieceTexts: pieces (distinct or not, empty, non-ASCII) and each
    segment's piece run, laid out with gaps and in any order in the index buffer."""
    pool = draw(pools())
    alphabet = st.sampled_from(["a", " ", "\n", "é", "日", "\ud800", "🙂"])
    pieces = draw(st.lists(st.text(alphabet, max_size=3), min_size=1, max_size=8))
    runs = [draw(st.lists(st.integers(0, len(pieces) - 1), max_size=5)) for _ in pool.seg_tokens]
    order = draw(st.permutations(range(len(runs))))
    idx, start, end = [], [0] * len(runs), [0] * len(runs)
    for i in order:
        idx += draw(st.lists(st.integers(0, len(pieces) - 1), max_size=2))  # a gap nobody refers to
        start[i] = len(idx)
        idx += runs[i]
        end[i] = len(idx)
    pool.seg_texts = PieceTexts(pieces, np.array(idx, dtype=np.uint16), np.array(start, dtype=np.int64),
                                np.array(end, dtype=np.int64))
    pool.plain_texts = ["".join(pieces[j] for j in run) for run in runs]  # the reference
    return pool


@settings(max_examples=100, deadline=None)
@given(piece_pools())
def test_piece_texts_are_the_joined_pieces_and_round_trip(pool):
    assert list(pool.seg_texts) == pool.plain_texts and pool.seg_texts == pool.plain_texts
    for q in range(len(pool)):
        want = "".join(pool.plain_texts[s] for s in pool.q_segments[q])
        assert pool.prompt_text(q) == want and pool.prompt_text(q) == want  # memoised or not, the same
    data = pool.to_bytes()
    back = Pool.from_bytes(data)
    assert isinstance(back.seg_texts, PieceTexts) and _pools_equal(back, pool)
    assert back.to_bytes() == data  # the archive does not depend on the buffer's layout


def test_piece_texts_keep_only_the_texts_several_queries_share():
    wl = build_workload(wl_cfg("gsp", num_queries=32, num_groups=2, prompts_per_group=16), seed=0, use_cache=False)
    pool = wl.requests[0]._pool
    system = {segs[0] for segs in pool.q_segments}
    kept = pool._shared_text  # built with the pool: the 2 system prompts, not the 32 questions
    assert set(kept) == system and all(kept[s] == pool.seg_texts[s] for s in system)
    texts = [r.text for r in wl.requests]
    assert texts == [r.text for r in wl.requests] and set(pool._shared_text) == system


def test_a_piece_text_out_of_range_is_rejected():
    seg = [np.zeros(1, dtype=np.int32)]
    gen = [np.zeros(1, dtype=np.int32)]
    bad_piece = PieceTexts(["a"], np.array([1], dtype=np.uint16), np.array([0]), np.array([1]))
    with pytest.raises(ValueError, match="missing piece"):
        Pool(seg, bad_piece, [(0,)], gen, [0], [0], [0]).check()
    bad_range = PieceTexts(["a"], np.array([0], dtype=np.uint16), np.array([0]), np.array([2]))
    with pytest.raises(ValueError, match="out of bounds"):
        Pool(seg, bad_range, [(0,)], gen, [0], [0], [0]).check()
    with pytest.raises(ValueError, match="do not fit"):
        PieceTexts(["a"] * 257, np.zeros(1, dtype=np.uint8), np.array([0]), np.array([1]))


@settings(max_examples=100, deadline=None)
@given(st.one_of(pools(), texted_pools()))
def test_pool_round_trips_through_the_streamed_archive(pool):
    data = pool.to_bytes()
    assert data == pool.to_bytes()  # deterministic: fixed member timestamps
    assert _pools_equal(Pool.from_bytes(data), pool)
    # np.load reads the archive as an ordinary .npz
    import io

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        assert np.array_equal(z["q_group"], np.asarray(pool.q_group))


def test_cache_file_is_magic_digest_payload_and_reads_back(tmp_path):
    import hashlib

    from repro.workloads import cache as wl_cache

    spec = resolve_spec(wl_cfg("gsp", num_queries=64, num_groups=4, prompts_per_group=16))
    pool = spec.make_pool(0, make_tokenizer(spec.cfg["tokenizer"]), None)
    path = tmp_path / "p.pool"
    wl_cache.write_stream(path, pool.write)
    raw = path.read_bytes()
    payload = raw[len(wl_cache.MAGIC) + 32:]
    assert raw.startswith(wl_cache.MAGIC) and raw[len(wl_cache.MAGIC):len(wl_cache.MAGIC) + 32] == hashlib.sha256(payload).digest()
    assert payload == pool.to_bytes() == wl_cache.read_payload(path)
    with wl_cache.open_payload(path) as f:
        assert _pools_equal(Pool.read(f), pool)
    assert not list(tmp_path.glob(".tmp-*"))  # no temp file left behind

"""TraceIndex: Fiat phases (segment-wise) against the naive per-token count, next use, distinct tokens."""

from hypothesis import given, settings
from hypothesis import strategies as st

from repro.kvcache import TraceIndex, as_key
from tests.kvcache.reference import fiat_phase_starts


@settings(max_examples=150, deadline=None)
@given(
    paths=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), min_size=1, max_size=25),
    extra=st.integers(0, 10),
)
def test_fiat_phases_match_naive(paths, extra):
    cap = max(len(p) for p in paths) + extra
    assert TraceIndex(paths).fiat_phases(cap) == fiat_phase_starts(paths, cap)


def test_trie_segments_next_use_and_distinct_tokens():
    paths = [[1, 2, 3], [1, 2], [1, 2, 3, 4], [5], [1, 2]]
    idx = TraceIndex(paths)
    segs, ends = idx.path_segments(2)
    assert ends == [2, 3, 4]  # split at the path ends 2 and 3
    assert [s.occ for s in segs] == [[0, 1, 2, 4], [0, 2], [2]]
    assert idx.next_use(segs[0], 1) == 2 and idx.next_use(segs[2], 2) is None
    assert idx.num_distinct_tokens == 5
    assert idx.distinct_tokens([0, 1, 2]) == 4 and idx.distinct_tokens([3, 4]) == 3
    assert idx.keys[1] == as_key([1, 2])


@settings(max_examples=100, deadline=None)
@given(paths=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=25),
       batch=st.integers(1, 6))
def test_group_distinct_tokens_match_the_union_of_each_group(paths, batch):
    idx = TraceIndex(paths)
    want = [len({tuple(p[:k]) for p in paths[g:g + batch] for k in range(1, len(p) + 1)})
            for g in range(0, len(paths), batch)]
    assert idx.group_distinct_tokens(batch) == want
    assert idx.group_distinct_tokens(batch) == want  # memoised: the same answer again

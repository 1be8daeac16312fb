"""The key primitive (repro/kvcache/keys.py): the common-prefix comparator against a brute-force one."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.kvcache import as_key, common_prefix_len, key_to_tokens


def brute(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_whole_tokens_only():
    a = as_key([1, 2, 3, 4])
    b = as_key([1, 2, 3 + 256, 4])  # differs in the 2nd byte of token 3: 2 tokens shared, not 9 bytes
    assert common_prefix_len(b, 0, a) == 8
    assert common_prefix_len(b"xx" * 2 + a, 4, a) == 16
    assert common_prefix_len("xxabcxyz", 2, "abcdef", 1) == 3
    assert common_prefix_len("xxabc", 2, "abc", 1) == 3
    assert key_to_tokens(a).tolist() == [1, 2, 3, 4]


@settings(max_examples=300, deadline=None)
@given(
    common=st.lists(st.integers(-3, 3), min_size=1, max_size=600),
    tail_a=st.lists(st.integers(-3, 3), max_size=300),
    tail_b=st.lists(st.integers(-3, 3), max_size=300),
    pad=st.lists(st.integers(-3, 3), max_size=5),
)
def test_matches_brute_force_for_tokens_and_characters(common, tail_a, tail_b, pad):
    a, b = common + tail_a, common + tail_b  # first unit equal: the comparator's precondition
    want = brute(a, b)
    assert common_prefix_len(as_key(pad + a), 4 * len(pad), as_key(b)) == 4 * want  # > 256 tokens: numpy path
    sa = "".join(chr(97 + t + 3) for t in pad + a)
    sb = "".join(chr(97 + t + 3) for t in b)
    assert common_prefix_len(sa, len(pad), sb, 1) == want
    assert common_prefix_len(as_key(np.asarray(a, dtype=np.int64)), 0, as_key(b)) == 4 * want

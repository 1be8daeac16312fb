"""RLT's phase reset as docs/ALGORITHMS.md §2 states it, quoted here and checked on the code."""

from __future__ import annotations

import re
from pathlib import Path

from repro.kvcache import make_cache

SPEC = "a new phase begins and all marks are\n    cleared"


def test_the_spec_says_a_phase_reset_clears_all_marks():
    text = (Path(__file__).resolve().parents[2] / "docs" / "ALGORITHMS.md").read_text()
    section = text[text.index("## 2. Eviction") : text.index("## 3. Routing")]
    assert SPEC in section
    assert not re.search(r"except the most recently\s+accessed", section.split("(The paper keeps")[0])


def test_a_phase_reset_leaves_only_the_missed_tokens_marked():
    # B = 4 cached tokens, all marked; a miss on token 5 finds the cache full: B + 1 marked -> a new
    # phase. No token cached before the reset stays marked; the missed token, inserted after it, is.
    c = make_cache(4, {"name": "rlt", "granularity": "token"}, 0)
    for path in ([1, 2], [3, 4]):
        c.dec_lock_ref(c.process_path(path).last_node)
    pol = c.policy
    assert pol.marked_count == 4 and pol.resets == 0
    c.dec_lock_ref(c.process_path([5]).last_node)
    assert pol.resets == 1
    marked = [c.path_key(n) for n in _nodes(c) if n.mark == pol.phase]
    assert marked == [c.path_key(c.match_prefix([5]).last_node)] and pol.marked_count == 1


def _nodes(cache):
    stack = list(cache.root.children.values())
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())

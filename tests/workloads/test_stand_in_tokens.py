"""Stand-in text is pool words, whose ids are known: the LooGLE and UltraChat stand-ins hand
the pool builder their segments' tokens (`tokens_of_words_in`) instead of running BPE over
them. Checked against the tokenizer itself: on random text around random words, and as the
whole pool's archive bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wl_helpers import wl_cfg

from repro.workloads.base import resolve_spec
from repro.workloads.pool import PoolBuilder
from repro.workloads.synthetic import llama3_word_pool, tokens_of_words_in, word_pool, words_segment
from repro.workloads.tokenizer import BuiltinTokenizer, make_tokenizer

LLAMA3 = make_tokenizer({"kind": "llama3", "path": None})
BUILTIN = BuiltinTokenizer()

# what templates and data put around words: spaces, newlines, punctuation, apostrophes,
# digits, letters (ASCII, accented, CJK), a combining mark, Llama-3's special tokens
_AROUND = st.lists(st.sampled_from([" ", "  ", "\n", "\n\n", "\r\n", "\t", ":", "?", "'", "'s", "'ll", "-", "(",
                                    "7", "42", "a", "Zq", "é", "\u0301", "中", "<|eot_id|>", "<|begin_of_text|>",
                                    "Input: ", "Question: "]), max_size=6).map("".join)


def _words(tok, rng, n):
    text, ids = words_segment(rng, n, tok)
    return text[:-1], ids[:-1]  # less the "\n"


@settings(max_examples=300, deadline=None)
@given(head=_AROUND, tail=_AROUND, n=st.integers(0, 12), seed=st.integers(0, 2**32 - 1),
       strip=st.booleans(), llama3=st.booleans())
def test_tokens_of_words_in_equal_the_tokenizer_on_the_whole_text(head, tail, n, seed, strip, llama3):
    tok = LLAMA3 if llama3 else BUILTIN
    words, ids = _words(tok, np.random.default_rng(seed), n)
    text = head + (words.strip() if strip else words) + tail
    got = tokens_of_words_in(tok, text, words, ids)
    assert (got is None) == (n < 3)
    if got is not None:
        assert got.tolist() == tok.encode(text).tolist()


@settings(max_examples=200, deadline=None)
@given(head=_AROUND, tail=_AROUND, n=st.integers(3, 12), seed=st.integers(0, 2**32 - 1), llama3=st.booleans())
def test_middle_words_found_without_their_neighbours_are_never_mistokenised(head, tail, n, seed, llama3):
    """The middle words met elsewhere than between the first and last word: right or None."""
    tok = LLAMA3 if llama3 else BUILTIN
    words, ids = _words(tok, np.random.default_rng(seed), n)
    mid = words[words.index(" ", 1) : words.rindex(" ")]
    text = head + mid + tail
    got = tokens_of_words_in(tok, text, words, ids)
    if got is not None:
        assert got.tolist() == tok.encode(text).tolist()
    else:
        assert tail[:1].isalpha()


def test_the_words_are_single_tokens_the_shortcut_relies_on():
    words, ids = llama3_word_pool(str(LLAMA3.file))
    assert all(LLAMA3.encode(w).tolist() == [i] for w, i in zip(words[::97], ids[::97]))
    assert all(BUILTIN.encode(w).tolist() == [BUILTIN.piece_id(w)] for w in word_pool()[::97])


def test_not_applicable_without_known_ids():
    class Other:  # e.g. an HF tokenizer: its ids are not known from the words
        kind = "hf"

    assert tokens_of_words_in(Other(), " a b c d", " a b c d", np.arange(4)) is None


def _pool_bytes(cfg, seed) -> bytes:
    spec = resolve_spec(cfg)
    buf = io.BytesIO()
    spec.make_pool(seed, make_tokenizer(spec.cfg["tokenizer"]), spec.resolve_data()).write(buf)
    return buf.getvalue()


STAND_INS = {
    "loogle-shared_prefix": ("loogle", dict(mode="shared_prefix", num_queries=24,
                                            stand_in={"doc_tokens_range": [300, 2000], "questions_per_doc_range": [1, 4]})),
    "loogle-follow_up": ("loogle", dict(mode="follow_up", num_queries=24,
                                        stand_in={"doc_tokens_range": [300, 2000], "questions_per_doc_range": [1, 4]})),
    "ultrachat": ("ultrachat", dict(num_queries=48)),
}


@pytest.mark.parametrize("tokenizer", ["llama3", "builtin"])
@pytest.mark.parametrize("case", sorted(STAND_INS))
def test_stand_in_pools_equal_running_the_tokenizer_on_every_segment(monkeypatch, tokenizer, case):
    """Each given segment's tokens equal the tokenizer on its text, and the pool (archive bytes)
    is the one every segment run through the tokenizer gives."""
    name, kw = STAND_INS[case]
    checked = []
    real_give = PoolBuilder.give_tokens

    def checking_give(self, text, tokens):
        if tokens is not None:
            checked.append(np.array_equal(tokens, self.tokenizer.encode(text)))
        real_give(self, text, tokens)

    for seed in (0, 1, 7):
        cfg = wl_cfg(name, source="synthetic", tokenizer={"kind": tokenizer, "path": None}, **kw)
        monkeypatch.setattr(PoolBuilder, "give_tokens", checking_give)
        before = len(checked)
        fast = _pool_bytes(cfg, seed)
        assert len(checked) > before and all(checked)
        monkeypatch.setattr(PoolBuilder, "give_tokens", lambda self, text, tokens: None)
        assert _pool_bytes(cfg, seed) == fast

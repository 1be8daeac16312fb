"""Multi-turn conversations -> queries (shared by ShareGPT, UltraChat and LooGLE).

Prompt layout: the tokenizer's chat template (tokenizer.CHAT_TEMPLATES; Llama-3's for the
default tokenizer, a plain "user:\\n" / "assistant:\\n" one for the built-in). Each piece is
one segment, so shared history is a shared token prefix:

    turn k prompt = [BOS, USER_HEADER, m_1 parts.., ASSISTANT_HEADER, reply_1 + EOT,
                     ...,
                     USER_HEADER, m_k parts.., ASSISTANT_HEADER]
    generated     = first output_len tokens of reply_k + EOT, EOS-padded

(BOS is "<|begin_of_text|>" with Llama-3 and absent with the built-in template; a message's
last part ends with EOT, "<|eot_id|>" or "\\n"; its parts are joined by `part_sep`.)

so turn k+1's prompt starts with turn k's prompt + the full recorded reply
(ARCHITECTURE.md "Request"), and a request's full path (prompt + generated) is a prefix
of the next turn's prompt whenever the reply has at least output_len tokens.

Filters, following SGLang's bench_serving `common_filter_chat`:
* a turn whose user message or reply has fewer than `min_tokens` tokens (not counting
  the segment's closing newline) is dropped from the conversation, history included;
  `min_reply_tokens=None` disables the reply check (SGLang does so for LooGLE);
* the first turn whose prompt + output_len exceeds `max_context_len` ends the
  conversation (later turns only grow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from repro.workloads.pool import PoolBuilder, generated_tokens
from repro.workloads.tokenizer import CHAT_TEMPLATES, ChatTemplate, chat_template

USER_HEADER = CHAT_TEMPLATES["builtin"].user_header
ASSISTANT_HEADER = CHAT_TEMPLATES["builtin"].assistant_header


@dataclass
class Turn:
    user_parts: list[str]  # the user message; several parts = several segments (document, question)
    reply: str


@dataclass
class ChatCounters:
    conversations_used: int = 0
    conversations_empty_after_filters: int = 0
    turns_kept: int = 0
    turns_too_short: int = 0
    turns_over_context: int = 0
    padded_generations: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {
            "conversations_used": self.conversations_used,
            "conversations_empty_after_filters": self.conversations_empty_after_filters,
            "turns_kept": self.turns_kept,
            "turns_too_short": self.turns_too_short,
            "turns_over_context": self.turns_over_context,
            "padded_generations": self.padded_generations,
        }
        d.update(self.extra)
        return d


def _content(text: str, t: ChatTemplate) -> str:
    return text.strip() if t.strip else text


def message_texts(parts: list[str], t: ChatTemplate) -> list[str]:
    """Segment texts of one message's parts: each but the last + part_sep, the last + end_of_turn."""
    n = len(parts)
    return [_content(p, t) + (t.part_sep if i < n - 1 else t.end_of_turn) for i, p in enumerate(parts)]


def reply_text(reply: str, t: ChatTemplate) -> str:
    """Segment text of a reply (it closes the turn)."""
    return _content(reply, t) + t.end_of_turn


def conversation_texts(turns: list[Turn], t: ChatTemplate) -> list[str]:
    """Every segment text `add_conversation` may tokenise for these turns (for batch prefetch)."""
    out = [x for x in (t.bos, t.user_header, t.assistant_header) if x]
    for turn in turns:
        out.extend(message_texts(turn.user_parts, t))
        out.append(reply_text(turn.reply, t))
    return out


def add_conversation(
    builder: PoolBuilder,
    turns: list[Turn],
    *,
    group_id: int,
    conversation_id: int,
    output_len: int,
    eos_id: int,
    max_context_len: int | None,
    min_tokens: int | None = 4,
    min_reply_tokens: int | None = 4,
    counters: ChatCounters,
    max_turns: int | None = None,
) -> int:
    """Add one conversation's turns as queries; returns the number of queries added."""
    t = chat_template(builder.tokenizer)
    uh = builder.segment(t.user_header)
    ah = builder.segment(t.assistant_header)
    history: list[int] = [builder.segment(t.bos)] if t.bos else []
    history_len = sum(builder.seg_len(s) for s in history)
    added = 0
    for turn in turns:
        if max_turns is not None and added >= max_turns:
            break
        parts = [builder.segment(x) for x in message_texts(turn.user_parts, t)]
        reply = builder.segment(reply_text(turn.reply, t))
        # minus each part's closing separator / end-of-turn (one token each; a separator merged
        # into the previous pre-token makes this one too low, only for multi-part messages)
        user_tokens = sum(builder.seg_len(s) for s in parts) - len(parts)
        reply_tokens = builder.seg_len(reply) - 1
        if (min_tokens is not None and user_tokens < min_tokens) or (
            min_reply_tokens is not None and reply_tokens < min_reply_tokens
        ):
            counters.turns_too_short += 1
            continue
        prompt = history + [uh, *parts, ah]
        prompt_len = history_len + builder.seg_len(uh) + sum(builder.seg_len(s) for s in parts) + builder.seg_len(ah)
        if max_context_len is not None and prompt_len + output_len > max_context_len:
            counters.turns_over_context += 1
            break
        gen, padded = generated_tokens(builder.seg_tokens[reply], output_len, eos_id)
        counters.padded_generations += int(padded)
        builder.add_query(prompt, gen, group=group_id, conversation=conversation_id, turn=added)
        added += 1
        history = prompt + [reply]
        history_len = prompt_len + builder.seg_len(reply)
    counters.turns_kept += added
    if added:
        counters.conversations_used += 1
    else:
        counters.conversations_empty_after_filters += 1
    return added

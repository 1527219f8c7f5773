"""Incremental encoding: match a request against its execution's tree, tokenize only what is new.

The request's messages (system first) are hashed as a chain; the longest prefix whose
hash the execution's index knows is reused as stored tokens (including the original
sampled output tokens, not a re-rendering of them). Only the messages after it, and the
generation prompt, are tokenized. An identical resend matches the whole input.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre_proxy.chat import (
    ChatRequest,
    Message,
    chain_hashes,
    system_message,
    system_sha,
)
from gyre_proxy.ingest.chains import ChainCache, text_size
from gyre_proxy.ingest.chat_template import ChatFormat, Rendered
from gyre_store.catalog import HASH_WORDS
from gyre_store.trees import ExecutionContext, PrefixPoint


def context_key(last_hash: bytes, thinking: bool) -> bytes:
    """The index key of a whole input: its messages plus the generation prompt."""
    return hashlib.blake2b(
        last_hash + (b"\x00gen:think" if thinking else b"\x00gen"), digest_size=16
    ).digest()


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A request as the engine will see it: a stored prefix plus new tokens."""

    prefix: PrefixPoint | None
    new_ids: npt.NDArray[np.int32]
    new_prov: npt.NDArray[np.uint8]
    msg_ends: npt.NDArray[np.int32]
    msg_hashes: npt.NDArray[np.uint32]
    messages: tuple[Message, ...]
    hashes: tuple[bytes, ...]
    context_hash: bytes
    system_sha: str
    tokenized: int  # tokens this call produced with the tokenizer

    @property
    def prefix_len(self) -> int:
        return 0 if self.prefix is None else self.prefix.offset

    @property
    def input_len(self) -> int:
        return self.prefix_len + int(self.new_ids.shape[0])


def full_messages(request: ChatRequest) -> tuple[Message, ...]:
    return (system_message(request.system, request.tools), *request.messages)


@dataclass(frozen=True, slots=True)
class Match:
    """A request matched against its execution's index, before anything is tokenized.

    ``matched`` messages (system first) are stored already; ``exact`` is set when the whole
    input, generation prompt included, is. ``pending_chars`` is the text still to render:
    a measure of what encoding will cost.
    """

    messages: tuple[Message, ...]
    hashes: tuple[bytes, ...]
    context_hash: bytes
    system_sha: str
    exact: PrefixPoint | None
    matched: int
    prefix: PrefixPoint | None

    @property
    def pending_chars(self) -> int:
        if self.exact is not None:
            return 0
        return sum(text_size(m) for m in self.messages[self.matched :])


def match_request(ctx: ExecutionContext, request: ChatRequest, chains: ChainCache | None = None) -> Match:
    """Hash the request's messages as a chain and find the longest stored prefix.

    With ``chains``, only the messages the execution's recent chains do not hold are hashed."""
    messages = full_messages(request)
    if chains is None:
        hashes, sha = tuple(chain_hashes(messages)), system_sha(messages[0])
    else:
        hashes, sha = chains.hashes(ctx.execution_id, messages)
    whole = context_key(hashes[-1], request.thinking)
    exact = ctx.index.get(whole)
    matched, prefix = 0, None
    if exact is None:
        for k in range(len(hashes), 0, -1):
            point = ctx.index.get(hashes[k - 1])
            if point is not None:
                matched, prefix = k, point
                break
    return Match(messages, hashes, whole, sha, exact, matched, prefix)


def encode_request(ctx: ExecutionContext, template: ChatFormat, request: ChatRequest) -> EncodedRequest:
    return encode_match(template, request, match_request(ctx, request))


def encode_match(template: ChatFormat, request: ChatRequest, match: Match) -> EncodedRequest:
    """Tokenize what ``match`` left: the messages after the stored prefix and the generation prompt."""
    messages, hashes, whole, sha = match.messages, match.hashes, match.context_hash, match.system_sha
    empty_i = np.zeros(0, dtype=np.int32)
    if match.exact is not None:
        return EncodedRequest(
            match.exact, empty_i, np.zeros(0, np.uint8), empty_i, np.zeros(0, np.uint32),
            messages, hashes, whole, sha, 0,
        )  # fmt: skip
    matched, prefix = match.matched, match.prefix
    out = Rendered()
    ends: list[int] = []
    indexed: list[bytes] = []  # the hashes of the messages in ``ends``
    base = 0 if prefix is None else prefix.offset
    parts, gen = template.render_new(request, messages, matched)
    for i, out_part in zip(range(matched, len(messages)), parts, strict=True):
        out.extend(out_part)
        if len(out_part):  # a context without a system turn has nothing to index for it
            ends.append(base + len(out))
            indexed.append(hashes[i])
    out.extend(gen)
    new_hashes = b"".join(indexed)
    return EncodedRequest(
        prefix=prefix,
        new_ids=np.asarray(out.ids, dtype=np.int32),
        new_prov=np.asarray(out.prov, dtype=np.uint8),
        msg_ends=np.asarray(ends, dtype=np.int32),
        msg_hashes=np.frombuffer(new_hashes, dtype="<u4").copy() if new_hashes else np.zeros(0, np.uint32),
        messages=messages,
        hashes=hashes,
        context_hash=whole,
        system_sha=sha,
        tokenized=len(out),
    )


def output_hash(encoded: EncodedRequest, assistant: Message) -> npt.NDArray[np.uint32]:
    """The chain hash of the context extended by the assistant message (as the harness will send it)."""
    h = chain_hashes([assistant], after=encoded.hashes[-1])[-1]
    return np.frombuffer(h, dtype="<u4").copy()


assert HASH_WORDS * 4 == 16  # chain hashes are 16 bytes

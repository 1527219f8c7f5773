"""The tool-call payload cache: every tool call the policy generated, its raw payload by call id.

A harness sends the policy's tool calls back re-serialized: keys reordered, spacing changed,
strings escaped differently, a freeform input wrapped as JSON, or the arguments truncated or
rewritten. Before a request is matched against the stored tree, each call whose id the proxy
issued for this execution gets back the payload exactly as it was sampled, so the history
hashes as the stored output did and the stored tokens are reused; a call id the proxy issued
for another execution is refused. The cache lives in memory: after a restart (or once an
execution is evicted) matching falls back to comparing tool inputs as canonical JSON.
"""

from __future__ import annotations

import msgspec

from gyre_proxy.chat import Block, ChatRequest, Message, ToolUseBlock
from gyre_proxy.exceptions import InvalidRequest


class PayloadCache:
    """Raw payloads (``ToolUseBlock.input_json`` as sampled) of generated calls, by call id."""

    def __init__(self) -> None:
        self._calls: dict[str, dict[str, str]] = {}  # execution -> call id -> raw payload
        self._owner: dict[str, str] = {}  # call id -> execution
        self.restored = 0  # payloads put back into requests (a call differed from its sample)

    def remember(self, execution_id: str, assistant: Message) -> None:
        """Keep the payload of every tool call in an answer the harness received."""
        for block in assistant.blocks:
            if isinstance(block, ToolUseBlock):
                self._calls.setdefault(execution_id, {})[block.id] = block.input_json
                self._owner[block.id] = execution_id

    def payload(self, execution_id: str, call_id: str) -> str | None:
        return self._calls.get(execution_id, {}).get(call_id)

    def restore(self, execution_id: str, request: ChatRequest) -> ChatRequest:
        """``request`` with each generated call's sampled payload back in place (the same object
        when nothing differed); ``InvalidRequest`` for a call id issued to another execution."""
        own = self._calls.get(execution_id, {})
        messages: list[Message] | None = None
        # Runs over the whole history on every request, so the usual case (nothing to put
        # back) allocates nothing: a message is rebuilt only when one of its calls differs.
        for i, message in enumerate(request.messages):
            blocks: list[Block] | None = None
            for j, b in enumerate(message.blocks):
                if not isinstance(b, ToolUseBlock):
                    continue
                sampled = self._sampled(execution_id, own, b)
                if sampled is not None:
                    if blocks is None:
                        blocks = list(message.blocks)
                    blocks[j] = ToolUseBlock(b.id, b.name, sampled)
            if blocks is not None:
                if messages is None:
                    messages = list(request.messages)
                messages[i] = Message(message.role, tuple(blocks))
        if messages is None:
            return request
        return msgspec.structs.replace(request, messages=tuple(messages))

    def _sampled(self, execution_id: str, own: dict[str, str], b: ToolUseBlock) -> str | None:
        """The payload to put back into call ``b``; None when it is as sampled (or unknown)."""
        owner = self._owner.get(b.id)
        if owner is not None and owner != execution_id:
            raise InvalidRequest(
                f"tool call {b.id!r} was generated for another execution; a history may only "
                "carry this execution's own calls"
            )
        sampled = own.get(b.id)
        if sampled is None or sampled == b.input_json:
            return None
        self.restored += 1
        return sampled

    def forget(self, execution_id: str) -> None:
        for call_id in self._calls.pop(execution_id, {}):
            self._owner.pop(call_id, None)

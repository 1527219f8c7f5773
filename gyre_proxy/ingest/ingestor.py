"""From a request and its answer to a stored TITO record.

``Ingestor.prepare`` matches and encodes a request against the execution's stored tree
and classifies it with the harness plug-in; ``Ingestor.record`` turns the engine's output
into a validated record and appends it. The answer pipeline and the trace generator both
go through here, so synthetic traces are stored exactly as real ones are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre_proxy.chat import ChatRequest, Message
from gyre_proxy.harness.plugin import CallTraits, HarnessPlugin
from gyre_proxy.ingest.chains import ChainCache
from gyre_proxy.ingest.chat_template import ChatFormat
from gyre_proxy.ingest.critiques import CritiqueBook
from gyre_proxy.ingest.incremental import EncodedRequest, Match, encode_match, match_request, output_hash
from gyre_proxy.ingest.payloads import PayloadCache
from gyre_store.catalog import CallFinish, ModelCallRecorded, Provenance, TitoArrays
from gyre_store.log import AppendResult, EventMetadata, NewEvent
from gyre_store.trees import PrefixPoint, TrajectoryRecorder


@dataclass(frozen=True, slots=True)
class Prepared:
    execution_id: str
    run_id: str
    request: ChatRequest
    encoded: EncodedRequest
    traits: CallTraits


class Ingestor:
    """Encodes requests incrementally and records their outputs, per execution."""

    def __init__(
        self,
        recorder: TrajectoryRecorder,
        template: ChatFormat,
        plugin: HarnessPlugin,
        critiques: CritiqueBook | None = None,
        payloads: PayloadCache | None = None,
        *,
        chain_chars: int = 1 << 30,
    ) -> None:
        self.recorder = recorder
        self.template = template
        self.plugin = plugin
        self.critiques = critiques or CritiqueBook()
        self.payloads = PayloadCache() if payloads is None else payloads
        # Message-chain hashes of recent requests, so a request hashes only what it adds
        # (None hashes every chain whole: the same result, at O(history) per request), their
        # text bounded by ``chain_chars``.
        self.chains: ChainCache | None = ChainCache(max_chars=chain_chars)

    def _restored(self, execution_id: str, request: ChatRequest) -> ChatRequest:
        """Critiques marked, and the sampled payload of every generated tool call put back."""
        return self.payloads.restore(execution_id, self.critiques.mark(execution_id, request))

    def prepare(
        self, execution_id: str, run_id: str, request: ChatRequest, match: Match | None = None
    ) -> Prepared:
        """Match (unless ``match`` is given) and encode ``request``; may read the log.

        A tool result that is a critique the execution asked for is encoded as one; tool calls
        the policy generated are matched and rendered with their payloads as sampled."""
        request = self._restored(execution_id, request)
        ctx = self.recorder.context(execution_id)
        if match is None:
            match = match_request(ctx, request, self.chains)
        encoded = encode_match(self.template, request, match)
        traits = self.plugin.classify(ctx, request, encoded.system_sha)
        return Prepared(execution_id, run_id, request, encoded, traits)

    def match(self, execution_id: str, request: ChatRequest) -> Match | None:
        """Match ``request`` against the execution's index without tokenizing anything.

        None when the execution's context is not in memory (matching would read the log).
        """
        request = self._restored(execution_id, request)  # refuses another execution's calls first
        ctx = self.recorder.cached_context(execution_id)
        return None if ctx is None else match_request(ctx, request, self.chains)

    def input_ids(self, prepared: Prepared, prefix_tokens: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
        """The full input for the engine: the stored prefix tokens, then the new ones."""
        return np.concatenate([prefix_tokens[: prepared.encoded.prefix_len], prepared.encoded.new_ids])

    def build(
        self,
        prepared: Prepared,
        *,
        request_id: str,
        output_ids: npt.NDArray[np.int32],
        output_logprobs: npt.NDArray[np.float32],
        assistant: Message | None,
        finish: CallFinish,
        delivered: bool | None = None,
        engine: str = "",
        weight_versions: tuple[tuple[int, int], ...] = (),
        retry_of: str | None = None,
        detail: str = "",
        started_at: float | None = None,
        first_token_s: float = 0.0,
        duration_s: float = 0.0,
    ) -> tuple[ModelCallRecorded, TitoArrays]:
        """The record of one answered (or aborted) call.

        ``assistant`` is the answer as the harness receives it (None when it never gets a
        complete one). ``delivered`` says whether the harness received these output tokens:
        they are trainable then; by default only a call that did not abort is. ``detail``
        says why an aborted attempt ended (kept on the record).
        """
        enc = prepared.encoded
        n_out = int(output_ids.shape[0])
        aborted = finish == CallFinish.ABORT
        trainable = (not aborted) if delivered is None else delivered
        complete = (
            assistant is not None
            and not aborted
            and n_out > 0
            and int(output_ids[-1]) in self.template.end_ids
        )
        arrays = TitoArrays(
            input_ids=enc.new_ids,
            input_prov=enc.new_prov,
            msg_ends=enc.msg_ends,
            msg_hashes=enc.msg_hashes,
            output_ids=np.asarray(output_ids, dtype=np.int32),
            output_logprobs=np.asarray(output_logprobs, dtype=np.float32),
            output_prov=np.full(n_out, Provenance.SAMPLED, dtype=np.uint8),
            output_trainable=np.full(n_out, trainable, dtype=np.bool_),
            # Only a complete answer (ending in its end token, <|im_end|> for Qwen) may be reused as history: a
            # truncated one comes back from the harness and is rendered whole instead.
            output_hash=output_hash(enc, assistant)
            if complete and assistant is not None
            else np.zeros(0, np.uint32),
        )
        event = ModelCallRecorded(
            execution_id=prepared.execution_id,
            run_id=prepared.run_id,
            request_id=request_id,
            prefix_of=None if enc.prefix is None else enc.prefix.request_id,
            prefix_len=enc.prefix_len,
            retry_of=retry_of,
            detail=detail,
            agent_kind=prepared.traits.agent_kind,
            agent_id=prepared.traits.agent_id,
            spawned_by=prepared.traits.spawned_by,
            purpose=prepared.traits.purpose,
            system_sha=enc.system_sha,
            context_hash=enc.context_hash.hex(),
            harness=self.plugin.name,
            finish=finish,
            engine=engine,
            weight_versions=weight_versions,
            started_at=time.time() if started_at is None else started_at,
            first_token_s=first_token_s,
            duration_s=duration_s,
        )
        if assistant is not None:
            self.plugin.observe_output(prepared.execution_id, assistant)
            self.payloads.remember(prepared.execution_id, assistant)
        return event, arrays

    def record(
        self, prepared: Prepared, *, metadata: EventMetadata | None = None, **kwargs: Any
    ) -> AppendResult:
        """Build and append a record now (synchronously); see :meth:`build` for the arguments."""
        event, arrays = self.build(prepared, **kwargs)
        return self.recorder.record(event, arrays, metadata)

    def stage(self, prepared: Prepared, *, metadata: EventMetadata | None = None, **kwargs: Any) -> NewEvent:
        """Build a record and apply it to the execution's context now; the caller appends it later."""
        event, arrays = self.build(prepared, **kwargs)
        return self.recorder.stage(event, arrays, metadata)


def continuation(prepared: Prepared, attempt: str, delivered_tokens: int) -> Prepared:
    """The request for a retry that continues an interrupted answer on another engine.

    Its context is the original input plus the ``delivered_tokens`` the harness already
    received from attempt ``attempt``; it adds no new input and no whole-input index entry.
    """
    enc = prepared.encoded
    z = np.zeros(0, dtype=np.int32)
    cont = EncodedRequest(
        prefix=PrefixPoint(attempt, enc.input_len + delivered_tokens, True),
        new_ids=z,
        new_prov=np.zeros(0, dtype=np.uint8),
        msg_ends=z,
        msg_hashes=np.zeros(0, dtype=np.uint32),
        messages=enc.messages,
        hashes=enc.hashes,
        context_hash=b"",
        system_sha=enc.system_sha,
        tokenized=0,
    )
    return Prepared(prepared.execution_id, prepared.run_id, prepared.request, cont, prepared.traits)

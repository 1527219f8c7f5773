"""From a harness's request to a stored TITO record: the chat formats (gyre's Qwen3 template,
a checkpoint's own tokenizer and Jinja template), matching a
request against its execution's trajectory tree so only new messages are tokenized (tool
calls restored to their sampled payloads by call id first), the
harness plug-ins that classify calls, the spool that appends records off the response
path, and the synthetic trace generator that goes through the same path. No engines, no HTTP.
"""

from __future__ import annotations

from gyre_proxy.ingest.chains import ChainCache
from gyre_proxy.ingest.chat_template import ChatFormat, Qwen3Template, Rendered
from gyre_proxy.ingest.checkpoint import load_chat_format
from gyre_proxy.ingest.critiques import CritiqueBook
from gyre_proxy.ingest.incremental import (
    EncodedRequest,
    Match,
    encode_match,
    encode_request,
    full_messages,
    match_request,
    output_hash,
)
from gyre_proxy.ingest.ingestor import Ingestor, Prepared, continuation
from gyre_proxy.ingest.jinja_format import JinjaChatFormat
from gyre_proxy.ingest.payloads import PayloadCache
from gyre_proxy.ingest.spool import RecordSpool
from gyre_proxy.ingest.tracegen import TraceConfig, TraceGenerator

__all__ = [
    "ChainCache",
    "ChatFormat",
    "CritiqueBook",
    "EncodedRequest",
    "Ingestor",
    "JinjaChatFormat",
    "Match",
    "PayloadCache",
    "Prepared",
    "Qwen3Template",
    "RecordSpool",
    "Rendered",
    "TraceConfig",
    "TraceGenerator",
    "continuation",
    "encode_match",
    "encode_request",
    "full_messages",
    "load_chat_format",
    "match_request",
    "output_hash",
]

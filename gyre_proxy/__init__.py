"""gyre_proxy: the proxy between a black-box harness and the policy's engines.

A harness speaks the Anthropic or OpenAI API to ``build_app``'s HTTP app; an ``Answerer``
(gyre's is ``AnswerPipeline``) tokenizes only what is new, routes the call to an engine,
streams the answer back and records it as TITO; ``ProxyService`` runs all of it over an
event log. The engine layer below is ``gyre_proxy.engines``, not exported here.
"""

from __future__ import annotations

from gyre_proxy.answer import AnswerPipeline, Router
from gyre_proxy.api import ApiSettings, build_app, proxy_server
from gyre_proxy.chat import Answerer, ChatRequest, ChatResponse, ExecutionAuth, KeyResolver, StreamEvent
from gyre_proxy.exceptions import (
    ApiError,
    AtCapacity,
    ChatFormatError,
    CheckpointLoadError,
    ContextTooLong,
    GyreProxyError,
    InvalidRequest,
    NotFound,
    Overloaded,
    RateLimited,
    RequestTooLarge,
    ServerStartError,
    TemplateNotIncremental,
    Unauthorized,
)
from gyre_proxy.harness import ClaudeCodeHarness, GenericHarness, HarnessPlugin
from gyre_proxy.hosting import ServerThread, free_port, reuseport_socket
from gyre_proxy.ingest import Ingestor, Qwen3Template, RecordSpool, TraceConfig, TraceGenerator
from gyre_proxy.service import (
    WORKER_HEADER,
    ProxyConfig,
    ProxyService,
    StoreKeys,
    WorkerSync,
    WorkerTable,
    issue_key,
    revoke_key,
)

__all__ = [
    "WORKER_HEADER",
    "AnswerPipeline",
    "Answerer",
    "ApiError",
    "ApiSettings",
    "AtCapacity",
    "ChatFormatError",
    "ChatRequest",
    "ChatResponse",
    "CheckpointLoadError",
    "ClaudeCodeHarness",
    "ContextTooLong",
    "ExecutionAuth",
    "GenericHarness",
    "GyreProxyError",
    "HarnessPlugin",
    "Ingestor",
    "InvalidRequest",
    "KeyResolver",
    "NotFound",
    "Overloaded",
    "ProxyConfig",
    "ProxyService",
    "Qwen3Template",
    "RateLimited",
    "RecordSpool",
    "RequestTooLarge",
    "Router",
    "ServerStartError",
    "ServerThread",
    "StoreKeys",
    "StreamEvent",
    "TemplateNotIncremental",
    "TraceConfig",
    "TraceGenerator",
    "Unauthorized",
    "WorkerSync",
    "WorkerTable",
    "build_app",
    "free_port",
    "issue_key",
    "proxy_server",
    "reuseport_socket",
    "revoke_key",
]

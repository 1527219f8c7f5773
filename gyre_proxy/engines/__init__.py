"""The engine layer, below the proxy and the cells: the ``Engine`` protocol and its domain
types, ``EngineClient`` (SGLang's native HTTP API), the engine errors, and the tokenizer the
proxy renders with. It knows nothing of harnesses, HTTP APIs or records. ``testing`` has the
in-memory ``FakeEngine``, ``weights`` (needs torch) moves weights to engines, and
``refengine`` is gyre's reference engine; none of the three is imported here.
"""

from __future__ import annotations

from gyre_proxy.engines.client import EngineClient, EngineClientConfig
from gyre_proxy.engines.sglang_server import SGLangServer, SGLangServerConfig
from gyre_proxy.engines.tokenizer import (
    CheckpointTokenizer,
    IncrementalText,
    QwenTokenizer,
    Tokenizer,
    encode_markup,
    encode_pieces,
    qwen_tokenizer,
    special_pattern,
)
from gyre_proxy.engines.types import (
    Engine,
    EngineInfo,
    ExposedKv,
    Finish,
    FinishKind,
    GenerateDelta,
    GenerateResult,
    ImportedKv,
    KvPayload,
    PinnedKv,
    SamplingConfig,
    WeightUpdate,
)
from gyre_proxy.exceptions import (
    ContextLengthExceeded,
    EngineBadRequest,
    EngineError,
    EngineNotAccepting,
    EngineProtocolError,
    EngineRequestAborted,
    EngineServerError,
    EngineUnavailable,
    GyreProxyError,
    KvCacheFull,
    KvCacheIncompatible,
    KvCacheNotFound,
    KvMigrationError,
    KvMigrationUnsupported,
    KvTransferFailed,
    KvTransferUnsupported,
    ModelLoadError,
    ReferenceEngineError,
    RequestRejected,
    ScriptError,
    WeightUpdateFailed,
)
from gyre_proxy.hosting import free_port

__all__ = [
    "CheckpointTokenizer",
    "ContextLengthExceeded",
    "Engine",
    "EngineBadRequest",
    "EngineClient",
    "EngineClientConfig",
    "EngineError",
    "EngineInfo",
    "EngineNotAccepting",
    "EngineProtocolError",
    "EngineRequestAborted",
    "EngineServerError",
    "EngineUnavailable",
    "ExposedKv",
    "Finish",
    "FinishKind",
    "GenerateDelta",
    "GenerateResult",
    "GyreProxyError",
    "ImportedKv",
    "IncrementalText",
    "KvCacheFull",
    "KvCacheIncompatible",
    "KvCacheNotFound",
    "KvMigrationError",
    "KvMigrationUnsupported",
    "KvPayload",
    "KvTransferFailed",
    "KvTransferUnsupported",
    "ModelLoadError",
    "PinnedKv",
    "QwenTokenizer",
    "ReferenceEngineError",
    "RequestRejected",
    "SGLangServer",
    "SGLangServerConfig",
    "SamplingConfig",
    "ScriptError",
    "Tokenizer",
    "WeightUpdate",
    "WeightUpdateFailed",
    "encode_markup",
    "encode_pieces",
    "free_port",
    "qwen_tokenizer",
    "special_pattern",
]

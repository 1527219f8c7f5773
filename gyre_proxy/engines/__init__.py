"""gyre_proxy: the harness-facing proxy and the engine layer it routes to.

So far this holds the engine layer: ``EngineClient`` (SGLang's native HTTP API), the
``Engine`` protocol with its domain types, the typed errors, and (in ``refengine``) gyre's
reference engine. ``gyre_proxy.engines.testing`` has the in-memory ``FakeEngine``;
``gyre_proxy.engines.weights`` (needs torch) moves weights to engines.
"""

from __future__ import annotations

from gyre_proxy.engines.client import EngineClient, EngineClientConfig
from gyre_proxy.engines.types import (
    Engine,
    EngineInfo,
    Finish,
    FinishKind,
    GenerateDelta,
    GenerateResult,
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
    ModelLoadError,
    ReferenceEngineError,
    ScriptError,
    WeightUpdateFailed,
)

__all__ = [
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
    "Finish",
    "FinishKind",
    "GenerateDelta",
    "GenerateResult",
    "GyreProxyError",
    "ModelLoadError",
    "ReferenceEngineError",
    "SamplingConfig",
    "ScriptError",
    "WeightUpdate",
    "WeightUpdateFailed",
]

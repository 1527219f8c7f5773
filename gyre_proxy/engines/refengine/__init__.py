"""gyre's reference engine: a small PyTorch causal LM served with SGLang's native HTTP API,
the embedded default and the engine of the tests. It speaks only that API: the proxy
reaches it through ``EngineClient`` as it would a real SGLang server. It needs torch, so
``gyre_proxy.engines`` does not import it.
"""

from __future__ import annotations

from gyre_proxy.engines.refengine.engine import ReferenceEngine, ReferenceEngineConfig
from gyre_proxy.engines.refengine.kvmooncake import MooncakeConfig
from gyre_proxy.engines.refengine.model import (
    DEFAULT_MODEL_CONFIG,
    LoadedModel,
    ModelSource,
    load_model,
    save_model_dir,
)
from gyre_proxy.engines.refengine.runner import ReferenceEngineServer, serve
from gyre_proxy.engines.refengine.scripted import ScriptedPolicy, ScriptEntry, ScriptRule
from gyre_proxy.engines.refengine.server import build_app
from gyre_proxy.engines.refengine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer
from gyre_proxy.exceptions import RequestRejected
from gyre_proxy.hosting import free_port

__all__ = [
    "DEFAULT_MODEL_CONFIG",
    "ByteTokenizer",
    "HFTokenizer",
    "LoadedModel",
    "ModelSource",
    "MooncakeConfig",
    "ReferenceEngine",
    "ReferenceEngineConfig",
    "ReferenceEngineServer",
    "RequestRejected",
    "ScriptEntry",
    "ScriptRule",
    "ScriptedPolicy",
    "Tokenizer",
    "build_app",
    "free_port",
    "load_model",
    "load_tokenizer",
    "save_model_dir",
    "serve",
]

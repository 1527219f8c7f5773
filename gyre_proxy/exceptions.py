"""Exceptions raised by ``gyre_proxy``.

Every error leaving the package derives from :class:`GyreProxyError`. HTTP and transport
failures are translated at the engine client (``raise ... from exc``), so callers never see
``httpx`` types. The tree::

    GyreProxyError
     ├── EngineError
     │    ├── EngineUnavailable
     │    │    └── EngineNotAccepting
     │    ├── EngineBadRequest
     │    │    └── ContextLengthExceeded
     │    ├── EngineRequestAborted
     │    ├── EngineServerError
     │    ├── EngineProtocolError
     │    └── WeightUpdateFailed
     └── ReferenceEngineError
          ├── ModelLoadError
          └── ScriptError
"""

from __future__ import annotations


class GyreProxyError(Exception):
    """An error in gyre's proxy layer."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or type(self).__name__).strip())


class EngineError(GyreProxyError):
    """An inference engine call failed."""


class EngineUnavailable(EngineError):
    """The engine could not be reached or did not answer in time."""


class EngineNotAccepting(EngineUnavailable):
    """The engine stopped accepting new requests (it is draining for a role transition)."""


class EngineBadRequest(EngineError):
    """The engine rejected the request as invalid."""


class ContextLengthExceeded(EngineBadRequest):
    """The request does not fit in the engine's context length."""


class EngineRequestAborted(EngineError):
    """The engine aborted the request with an error or ended its stream without a finish."""


class EngineServerError(EngineError):
    """The engine failed while serving the request."""


class EngineProtocolError(EngineError):
    """The engine answered with a body that does not follow SGLang's API."""


class WeightUpdateFailed(EngineError):
    """The engine reported that a weight update did not succeed."""


class ReferenceEngineError(GyreProxyError):
    """gyre's reference engine could not be configured."""


class ModelLoadError(ReferenceEngineError):
    """The reference engine's model or tokenizer could not be built or loaded."""


class ScriptError(ReferenceEngineError):
    """A scripted-policy file is malformed or does not fit the tokenizer."""

"""Exceptions raised by ``gyre_proxy``: one tree under :class:`GyreProxyError`.

HTTP and transport failures are translated where they happen (the engine client, the API
adapters), so callers never see ``httpx`` or Starlette types. The ``ApiError`` branch is
what a harness is answered with: each class carries its Anthropic and OpenAI status and
error type, and ``gyre_proxy.api.errors`` writes them in each API's wire shape. The tree::

    GyreProxyError
     ├── EngineError
     │    ├── EngineUnavailable
     │    │    └── EngineNotAccepting
     │    ├── EngineBadRequest
     │    │    └── ContextLengthExceeded
     │    ├── EngineRequestAborted
     │    ├── EngineServerError
     │    ├── EngineProtocolError
     │    │    └── WeightVersionInvalid
     │    ├── WeightUpdateFailed
     │    └── KvMigrationError
     │         ├── KvCacheNotFound
     │         ├── KvCacheFull
     │         ├── KvCacheIncompatible
     │         ├── KvMigrationUnsupported
     │         ├── KvTransferUnsupported
     │         └── KvTransferFailed
     ├── ReferenceEngineError
     │    ├── ModelLoadError
     │    ├── ScriptError
     │    └── RequestRejected
     │         └── KvRefused
     │              ├── PinNotFound
     │              ├── KvStoreFull
     │              ├── PayloadIncompatible
     │              ├── CacheNotMigratable
     │              ├── TransferUnavailable
     │              └── TransferFailed
     ├── ServerStartError
     ├── ChatFormatError
     │    ├── CheckpointLoadError
     │    └── TemplateNotIncremental
     ├── SpoolError
     │    ├── SpoolInUse
     │    └── SpoolClosed
     ├── HarnessError
     │    └── LaunchError
     └── ApiError                 500 api_error             / 500 server_error
          ├── InvalidRequest      400 invalid_request_error (both)
          │    └── ContextTooLong 400, OpenAI code context_length_exceeded
          ├── Unauthorized        401 authentication_error  / invalid_api_key
          ├── SnapshotRefused     403 permission_error      / snapshot_refused
          ├── NotFound            404 not_found_error
          ├── RequestTooLarge     413 request_too_large
          ├── RateLimited         429 rate_limit_error      / rate_limit_exceeded
          └── Overloaded          529 overloaded_error      / 503 server_error
               └── AtCapacity     529 overloaded_error      / 429 rate_limit_exceeded
"""

from __future__ import annotations

from typing import ClassVar


class GyreProxyError(Exception):
    """An error in gyre's proxy layer."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or type(self).__name__).strip())


# -- engines -----------------------------------------------------------------------------------


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


class WeightVersionInvalid(EngineProtocolError):
    """The engine reported a weight version that names no policy version (gyre publishes
    integer versions, e.g. "3")."""


class WeightUpdateFailed(EngineError):
    """The engine reported that a weight update did not succeed."""


class KvMigrationError(EngineError):
    """A KV-cache migration step was refused; abort plainly and re-prefill on the destination."""


class KvCacheNotFound(KvMigrationError):
    """The engine holds no KV for this request id: it is not decoding (finished, waiting or
    unknown) or its pinned cache was already released."""


class KvCacheFull(KvMigrationError):
    """The engine's bound on kept KV caches (entries or bytes) refuses another one; release
    pinned caches first."""


class KvCacheIncompatible(KvMigrationError):
    """The KV payload does not fit the destination's model (layers, KV heads, head dim, dtype,
    weight version) or is malformed."""


class KvMigrationUnsupported(KvMigrationError):
    """The engine cannot migrate KV caches (a real SGLang server, or a model whose cache is not
    plain per-layer keys and values)."""


class KvTransferUnsupported(KvMigrationError):
    """The engine cannot move KV payloads over Mooncake Transfer Engine (not installed, not
    importable, turned off, or another protocol than its peer's); move it over HTTP instead
    (``export_kv`` and ``import_kv``)."""


class KvTransferFailed(KvMigrationError):
    """The destination could not read the KV payload from the source's Transfer Engine (the
    source went away, or released it); the source still holds its pin: move it over HTTP."""


class ReferenceEngineError(GyreProxyError):
    """gyre's reference engine could not be configured."""


class ModelLoadError(ReferenceEngineError):
    """The reference engine's model or tokenizer could not be built or loaded."""


class ScriptError(ReferenceEngineError):
    """A scripted-policy file is malformed or does not fit the tokenizer."""


class RequestRejected(ReferenceEngineError):
    """The reference engine refused a request; ``status`` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class KvRefused(RequestRejected):
    """A KV-cache call the reference engine refuses; ``code`` goes in the error body (the client
    maps it back to a ``KvMigrationError``: gyre_proxy.engines.wire holds the same codes)."""

    code: ClassVar[str] = "kv_unsupported"
    http_status: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        super().__init__(message, self.http_status)


class PinNotFound(KvRefused):
    """No pinned cache (or no decoding request to pin) under this rid."""

    code = "kv_not_found"
    http_status = 404


class KvStoreFull(KvRefused):
    """The bound on kept caches (entries or bytes) refuses another one."""

    code = "kv_cache_full"
    http_status = 409


class PayloadIncompatible(KvRefused):
    """A KV payload that does not fit this engine's model, or is malformed."""

    code = "kv_incompatible"
    http_status = 422


class CacheNotMigratable(KvRefused):
    """This model's cache is not plain per-layer keys and values."""

    code = "kv_unsupported"
    http_status = 400


class TransferUnavailable(KvRefused):
    """This engine cannot move KV payloads over Mooncake Transfer Engine."""

    code = "kv_transfer_unsupported"
    http_status = 501


class TransferFailed(KvRefused):
    """Reading a KV payload from the source's Transfer Engine failed."""

    code = "kv_transfer_failed"
    http_status = 502


# -- HTTP servers -------------------------------------------------------------------------------


class ServerStartError(GyreProxyError):
    """An HTTP server (the proxy or the reference engine) did not start."""


class ChatFormatError(GyreProxyError):
    """The policy's tokenizer or chat template cannot render a conversation."""


class CheckpointLoadError(ChatFormatError):
    """A checkpoint's tokenizer or chat template cannot be loaded (the message names the file)."""


class TemplateNotIncremental(ChatFormatError):
    """The chat template renders a conversation differently from its own prefix, in a way
    that token-in/token-out recording cannot follow (the message names the message)."""


class SpoolError(GyreProxyError):
    """The record spool cannot take records."""


class SpoolInUse(SpoolError):
    """Another proxy process holds the spool directory; give each proxy its own (--spool-dir)."""


class SpoolClosed(SpoolError):
    """The record spool is closed: a record submitted now would never be written."""


# -- answers to the harness ---------------------------------------------------------------------


class HarnessError(GyreProxyError):
    """A harness cannot be used as configured (unknown name, not installed, cannot be launched)."""


class LaunchError(HarnessError):
    """An execution's harness could not be started (bad task, workspace or start request)."""


class ApiError(GyreProxyError):
    """The server failed to answer the request."""

    anthropic_status: ClassVar[int] = 500
    anthropic_type: ClassVar[str] = "api_error"
    openai_status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    openai_code: ClassVar[str | None] = None

    def __init__(
        self, message: str | None = None, *, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = str(self)
        self.param = param
        self.retry_after_s = retry_after_s


class InvalidRequest(ApiError):
    """The request is malformed."""

    anthropic_status = 400
    anthropic_type = "invalid_request_error"
    openai_status = 400
    openai_type = "invalid_request_error"


class ContextTooLong(InvalidRequest):
    """prompt is too long for the model's context window"""

    openai_code = "context_length_exceeded"

    def __init__(
        self, message: str | None = None, *, input_tokens: int | None = None, limit: int | None = None
    ) -> None:
        # Claude Code starts its automatic compaction on a 400 whose message begins
        # "prompt is too long", so that prefix is kept whatever the numbers are.
        if message is None and input_tokens is not None and limit is not None:
            message = f"prompt is too long: {input_tokens} tokens > {limit} maximum"
        elif message is not None and not message.lower().startswith("prompt is too long"):
            message = f"prompt is too long: {message}"
        super().__init__(message, param="messages")


class Unauthorized(ApiError):
    """invalid x-api-key"""

    anthropic_status = 401
    anthropic_type = "authentication_error"
    openai_status = 401
    openai_type = "invalid_request_error"
    openai_code = "invalid_api_key"


class SnapshotRefused(ApiError):
    """An evaluation was asked of a location that is not the execution's own snapshot."""

    anthropic_status = 403
    anthropic_type = "permission_error"
    openai_status = 403
    openai_type = "invalid_request_error"
    openai_code = "snapshot_refused"


class NotFound(ApiError):
    """Not found."""

    anthropic_status = 404
    anthropic_type = "not_found_error"
    openai_status = 404
    openai_type = "invalid_request_error"


class RequestTooLarge(ApiError):
    """Request exceeds the maximum allowed number of bytes."""

    anthropic_status = 413
    anthropic_type = "request_too_large"
    openai_status = 413
    openai_type = "invalid_request_error"
    openai_code = "request_too_large"


class RateLimited(ApiError):
    """Too many requests for this API key; retry later."""

    anthropic_status = 429
    anthropic_type = "rate_limit_error"
    openai_status = 429
    openai_type = "requests"
    openai_code = "rate_limit_exceeded"


class Overloaded(ApiError):
    """Overloaded"""

    anthropic_status = 529
    anthropic_type = "overloaded_error"
    openai_status = 503
    openai_type = "server_error"
    openai_code = "overloaded"


class AtCapacity(Overloaded):
    """This proxy worker has as many model calls in flight as it takes; retry shortly."""

    # OpenAI's own shape for "come back later": a 429, which its SDK and Codex retry after
    # the retry-after header.
    openai_status = 429
    openai_type = "requests"
    openai_code = "rate_limit_exceeded"

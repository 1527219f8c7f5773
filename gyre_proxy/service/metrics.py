"""The proxy's Prometheus metrics, served at ``GET /metrics`` on the proxy's own port.

``ProxyMetrics`` holds the metrics of one proxy process: requests and errors by API, requests in
flight, tokens in and out, the latency the proxy adds over its engines (measured by the
answer pipeline, ``AnswerObserver``), and the proxy's overhead on each response as its
``x-gyre-overhead-duration-ms`` header reports it. ``metered`` wraps the proxy's ASGI app to
count each request, to put that header on every API response, and to answer ``/metrics``.
Nothing is counted per streamed token, only per request.

The overhead header (named as gateways name theirs, e.g. LiteLLM's
``x-litellm-overhead-duration-ms``) is the milliseconds from the proxy's app receiving the
request (its head parsed by the HTTP server) to the response's status line being sent, less
the time the answer waited on an engine's stream in between (``EngineWait``). A response
that is not streamed is sent whole, so its header covers all of the proxy's work on it
(reading and checking the body, matching and encoding, routing, the answer's parsing and
encoding, staging its record). A streamed response sends its status line before the engine
is asked (once the request is encoded and admitted), so its header covers that work only;
what the proxy adds while the answer streams is in ``gyre_proxy_added_latency_seconds``.

Several workers (``gyre proxy serve --workers N``) share one port, and a scrape reaches
whichever worker the kernel picks; so the workers run in prometheus_client's multiprocess
mode: each writes its values to files in one folder (``PROMETHEUS_MULTIPROC_DIR``, made by the
supervisor), and the worker that answers a scrape sums every worker's counters and histograms,
and the in-flight gauges of the workers alive (``livesum``). A worker that died keeps its counts
in the sums (counters never go back); the supervisor drops its gauge.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from gyre_proxy.api import STREAM_ERROR_KEY
from gyre_proxy.chat import ENGINE_WAIT, EngineWait
from gyre_proxy.exceptions import ApiError

# The harness-facing paths counted, by the API (label ``api``) each serves.
API_OF_PATH: Mapping[str, str] = {
    "/v1/messages": "anthropic_messages",
    "/v1/messages/count_tokens": "anthropic_count_tokens",
    "/v1/chat/completions": "openai_chat",
    "/v1/responses": "openai_responses",
    "/gyre/v1/evaluate": "gyre_evaluate",
}

# An error's kind (label ``kind``) from its HTTP status; both APIs' statuses name one kind each
# (gyre_proxy.exceptions: Overloaded is 529 for Anthropic and 503 for OpenAI).
ERROR_KIND_OF_STATUS: Mapping[int, str] = {
    400: "invalid_request",
    401: "authentication",
    404: "not_found",
    413: "request_too_large",
    429: "rate_limit",
    503: "overloaded",
    529: "overloaded",
}

# Seconds: the proxy adds about 2.5 ms to a short call on a quiet machine and up to a few
# hundred ms under load (docs/proxy.md).
ADDED_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Seconds: the proxy's time on a request outside the engines is about a millisecond on a quiet
# machine, tens of ms for a long history's first request, and more while its loop is queued.
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

OVERHEAD_HEADER = "x-gyre-overhead-duration-ms"
_OVERHEAD_HEADER = OVERHEAD_HEADER.encode()
_SSE_TYPE = b"text/event-stream"

METRIC_NAMES = (
    "gyre_proxy_requests_total",
    "gyre_proxy_errors_total",
    "gyre_proxy_requests_in_flight",
    "gyre_proxy_tokens_total",
    "gyre_proxy_added_latency_seconds",
    "gyre_proxy_overhead_duration_seconds",
)


def error_kind(status: int) -> str:
    """The ``kind`` label of an error answered with HTTP ``status``."""
    return ERROR_KIND_OF_STATUS.get(status, "api_error" if status >= 500 else f"http_{status}")


class ProxyMetrics:
    """One proxy process's metrics; an ``AnswerObserver`` of its answer pipeline.

    ``multiprocess_dir``: the folder every worker writes its values to (prometheus_client's
    multiprocess mode, which must be switched on by ``PROMETHEUS_MULTIPROC_DIR`` in the
    worker's environment before prometheus_client is imported); ``/metrics`` then reports the
    sums over all workers. None: this process's values only.
    """

    def __init__(self, *, multiprocess_dir: Path | None = None) -> None:
        self.registry = CollectorRegistry()
        self.multiprocess_dir = multiprocess_dir
        self.requests = Counter(
            "gyre_proxy_requests", "Harness requests received, by API.", ["api"], registry=self.registry
        )
        self.errors = Counter(
            "gyre_proxy_errors",
            "Requests answered with an error (an HTTP error, or an error event in a stream), by API and kind.",
            ["api", "kind"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "gyre_proxy_requests_in_flight",
            "Harness requests being answered now.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.tokens = Counter(
            "gyre_proxy_tokens",
            "Tokens of finished model calls as their usage reported them: input (the context) and output (generated).",
            ["direction"],
            registry=self.registry,
        )
        self.added_latency = Histogram(
            "gyre_proxy_added_latency_seconds",
            "Per finished model call: seconds in the answer pipeline not spent waiting on an engine.",
            buckets=ADDED_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.overhead = Histogram(
            "gyre_proxy_overhead_duration_seconds",
            "Per API response: seconds from the request's arrival to the response's status line, "
            "less the waits on engines in between (the x-gyre-overhead-duration-ms header), by API "
            "and whether the response streams (its status line then goes out before the engine is asked).",
            ["api", "stream"],
            buckets=OVERHEAD_BUCKETS,
            registry=self.registry,
        )
        # Children bound once: a request costs a counter increment, not a label lookup.
        self._requests = {api: self.requests.labels(api=api) for api in API_OF_PATH.values()}
        self._overhead = {
            (api, stream): self.overhead.labels(api=api, stream="true" if stream else "false")
            for api in API_OF_PATH.values()
            for stream in (False, True)
        }
        self._tokens_in = self.tokens.labels(direction="input")
        self._tokens_out = self.tokens.labels(direction="output")

    # -- the answer pipeline's observer ----------------------------------------------------------
    def answered(self, input_tokens: int, output_tokens: int, added_s: float) -> None:
        self._tokens_in.inc(input_tokens)
        self._tokens_out.inc(output_tokens)
        self.added_latency.observe(max(0.0, added_s))

    # -- per request -------------------------------------------------------------------------------
    def request_started(self, api: str) -> None:
        self._requests[api].inc()
        self.in_flight.inc()

    def responded(self, api: str, overhead_s: float, *, stream: bool) -> None:
        """A response's status line went out ``overhead_s`` after its request arrived, less its
        waits on engines."""
        self._overhead[api, stream].observe(max(0.0, overhead_s))

    def request_ended(self, api: str, error: str | None) -> None:
        self.in_flight.dec()
        if error is not None:
            self.errors.labels(api=api, kind=error).inc()

    def exposition(self) -> bytes:
        """The metrics in Prometheus's text format (every worker's, summed, in multiprocess mode)."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return generate_latest(registry)


def overhead_header(overhead_s: float) -> tuple[bytes, bytes]:
    """The ``x-gyre-overhead-duration-ms`` header for ``overhead_s`` seconds (ms, 3 decimals)."""
    return _OVERHEAD_HEADER, b"%.3f" % (max(0.0, overhead_s) * 1e3)


def metered(app: Any, metrics: ProxyMetrics) -> Any:
    """``app`` (ASGI) counting each harness request in ``metrics``, putting the overhead header on
    each API response (and its figure in ``gyre_proxy_overhead_duration_seconds``), and
    answering ``GET /metrics``.

    An error is a response whose status is 400 or more, or a stream that ended with an error
    event after its status line (``api/sse.py`` notes that error in the request's scope).
    """

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/metrics" and scope["method"] == "GET":
            body = metrics.exposition()
            headers = [
                (b"content-type", CONTENT_TYPE_LATEST.encode()),
                (b"content-length", b"%d" % len(body)),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        api = API_OF_PATH.get(path)
        if api is None:  # /health, /v1/models, unknown paths: not harness requests
            await app(scope, receive, send)
            return
        status = 0
        began = time.perf_counter()
        wait = EngineWait()

        async def noting_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                overhead_s = time.perf_counter() - began - wait.seconds
                headers = list(message.get("headers", ()))
                stream = any(k.lower() == b"content-type" and v.startswith(_SSE_TYPE) for k, v in headers)
                headers.append(overhead_header(overhead_s))
                message = {**message, "headers": headers}
                metrics.responded(api, overhead_s, stream=stream)
            await send(message)

        metrics.request_started(api)
        error: str | None = None
        token = ENGINE_WAIT.set(wait)
        try:
            await app(scope, receive, noting_status)
        except Exception:
            error = error_kind(status or 500)
            raise
        finally:
            ENGINE_WAIT.reset(token)
            streamed: ApiError | None = scope.get(STREAM_ERROR_KEY)
            if error is None and status >= 400:
                error = error_kind(status)
            elif error is None and streamed is not None:
                error = error_kind(streamed.anthropic_status)
            metrics.request_ended(api, error)

    return wrapped

"""The proxy as a running service: ``ProxyService`` assembles the store, engine clients,
routing, the record spool, API keys and the HTTP app into one context manager, and the
API keys (each writes into one execution) live in the event log. Assembly only: what each
part does is in its own subpackage.
"""

from __future__ import annotations

from gyre_proxy.service.capacity import InFlightLimit
from gyre_proxy.service.evaluations import SNAPSHOTS
from gyre_proxy.service.keys import StoreKeys, issue_key, key_hash, revoke_key
from gyre_proxy.service.metrics import OVERHEAD_HEADER, ProxyMetrics, metered
from gyre_proxy.service.proxy_service import WORKER_HEADER, ProxyConfig, ProxyService
from gyre_proxy.service.workers import WorkerSync, WorkerTable

__all__ = [
    "OVERHEAD_HEADER",
    "SNAPSHOTS",
    "WORKER_HEADER",
    "InFlightLimit",
    "ProxyConfig",
    "ProxyMetrics",
    "ProxyService",
    "StoreKeys",
    "WorkerSync",
    "WorkerTable",
    "issue_key",
    "key_hash",
    "metered",
    "revoke_key",
]

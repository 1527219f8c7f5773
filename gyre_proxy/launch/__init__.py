"""Launching executions: a fresh workspace per execution built from its task, the harness
started against the proxy with the execution's own key, supervised against its budget, and
its lifecycle (started, preserved, finished with the real reason) recorded in the log.
It carries out start requests; it does not decide them, nor score what the harness did.
"""

from __future__ import annotations

from gyre_proxy.exceptions import LaunchError
from gyre_proxy.launch.launcher import FOLLOWED, Launcher, LauncherConfig, Running, default_root
from gyre_proxy.launch.liveness import Liveness, RedisLiveness
from gyre_proxy.launch.placement import SANDBOX_SNAPSHOTS, Placed, Placement
from gyre_proxy.launch.workspace import ExecutionDirs, artifact_version, prepare, safe_name

__all__ = [
    "FOLLOWED",
    "SANDBOX_SNAPSHOTS",
    "ExecutionDirs",
    "LaunchError",
    "Launcher",
    "LauncherConfig",
    "Liveness",
    "Placed",
    "Placement",
    "RedisLiveness",
    "Running",
    "artifact_version",
    "default_root",
    "prepare",
    "safe_name",
]

"""Small configs shared by the scheduler tests."""

from __future__ import annotations

from gyre_sched import ClusterConfig, PolicyKind, SchedConfig


def tiny(policy: PolicyKind = PolicyKind.ELASTIC, **changes: object) -> SchedConfig:
    """4 cells of 8, groups of 2, batches of 4: small enough to script by hand."""
    fields: dict[str, object] = {
        "policy": policy,
        "cells": 4,
        "cell_capacity": 8,
        "pool_capacity": 0,
        "group_size": 2,
        "batch_groups": 4,
        "phi": 0.5,
        "mu": 2,
        "rho_min": 0.5,
        "tau_s": 10.0,
    }
    if policy is PolicyKind.ASYNC:
        fields.update(cells=2, pool_capacity=16)
    fields.update(changes)
    return SchedConfig(**fields).validate()  # type: ignore[arg-type]


def small_cluster(streaming: bool = True) -> ClusterConfig:
    """Fast training so that rollout dominates, as in the paper."""
    return ClusterConfig(cell_nodes=1, train_node_hours_per_group=0.05, streaming=streaming)

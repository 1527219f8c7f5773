"""The fitted constants in presets.py are what the fit gives, checked without the whole fit.

``gyre simulate --fit`` refits everything in minutes and exits 1 when presets.py differs;
this runs in CI in seconds: each fitted constant is rounded as the fit rounds it and sits
at a minimum of the fit's own loss against one step either way, on the fit's draws and
seeds (``gyre_sched.sim.fit_check``), so a constant edited by hand fails here.
"""

from __future__ import annotations

import msgspec
import pytest

from gyre_sched.sim import WORKLOADS, check_presets
from gyre_sched.sim import fit_check as checked
from gyre_sched.sim.fit import SHAPE


def test_every_fitted_constant_is_at_the_fits_minimum() -> None:
    assert [f"{d.constant}: {d.detail}" for d in check_presets()] == []


def _edit(monkeypatch: pytest.MonkeyPatch, workload: str, field: str, value: float) -> None:
    """presets.py with one workload field edited by hand (a shape field in both workloads,
    as the 2.4T fit copies the 122B shape, so only the loss can tell)."""
    edited = dict(WORKLOADS)
    for name in ("nl2repo-122b", "nl2repo-2.4t") if field in SHAPE else (workload,):
        edited[name] = msgspec.structs.replace(WORKLOADS[name], **{field: value})
    monkeypatch.setattr(checked, "WORKLOADS", edited)


@pytest.mark.parametrize(
    ("workload", "field", "value"),
    [
        ("nl2repo-122b", "median_h", 1.69),
        ("nl2repo-122b", "hard_share", 0.07),
        ("nl2repo-122b", "overall_latent_h", 11.6),  # the loss is flat over a few units here
        ("nl2repo-2.4t", "overall_latent_h", 12.1),
    ],
)
def test_a_workload_constant_edited_by_hand_is_found(
    monkeypatch: pytest.MonkeyPatch, workload: str, field: str, value: float
) -> None:
    _edit(monkeypatch, workload, field, value)
    assert check_presets(costs=False) != []


def test_a_2_4t_shape_other_than_the_122b_fits_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    edited = dict(WORKLOADS)
    edited["nl2repo-2.4t"] = msgspec.structs.replace(WORKLOADS["nl2repo-2.4t"], sigma_exec=0.3)
    monkeypatch.setattr(checked, "WORKLOADS", edited)
    assert "WORKLOADS['nl2repo-2.4t'].sigma_exec" in [d.constant for d in check_presets(costs=False)]


def test_a_value_the_fit_would_have_rounded_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    _edit(monkeypatch, "nl2repo-122b", "median_h", 1.6871)
    found = check_presets(costs=False)
    assert any(d.constant == "WORKLOADS['nl2repo-122b'].median_h" and "rounded" in d.detail for d in found)

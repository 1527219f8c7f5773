"""The suite's Hypothesis profile (tests/conftest.py) is the one in force: no property test may
fail on a wall-clock check while CI's two shared cores are busy."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def test_property_tests_run_without_a_deadline_or_the_too_slow_check() -> None:
    # A test's own @settings(max_examples=...) inherits the rest from this default.
    inherited = settings(max_examples=1)
    assert inherited.deadline is None
    assert HealthCheck.too_slow in inherited.suppress_health_check

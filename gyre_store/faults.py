"""Fault injection for the fault tests: a process that reaches a named point dies there, once.

``GYRE_FAULT=<point>@<marker>[,<point>@<marker>...]`` (read by the process entry points that
offer points, and passed to them as ``FaultPoint.from_env()``) makes the first process of the
run that reaches ``<point>`` exit at once with status 137, as a SIGKILL would leave it: no
cleanup, no goodbye. ``<marker>`` is a file created when the fault fires, so a process started
again after it passes the point unharmed. Points are named by who offers them, e.g. ``cell-1:restore``
(an elastic cell starting a step) or ``controller:stop_accepting`` (the controller, right after
recording that protocol step). Nothing fires when the variable is unset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KILLED_STATUS = 137


@dataclass(frozen=True, slots=True)
class FaultPoint:
    """Where to die (each point, with the marker that makes it happen only once)."""

    points: tuple[tuple[str, Path], ...]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FaultPoint | None:
        """The faults ``GYRE_FAULT`` names, or None. Raises ValueError on a malformed value."""
        value = (os.environ if env is None else env).get("GYRE_FAULT", "")
        if not value:
            return None
        points = []
        for entry in value.split(","):
            point, sep, marker = entry.partition("@")
            if not (point and sep and marker):
                raise ValueError(f"GYRE_FAULT must be <point>@<marker file>[,...], got {value!r}")
            points.append((point, Path(marker)))
        return cls(tuple(points))

    def reached(self, point: str) -> None:
        """Exit at once if ``point`` is one of these faults' and it has not fired yet."""
        for name, marker in self.points:
            if name != point:
                continue
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue  # fired before: a process started again goes on
            os._exit(KILLED_STATUS)

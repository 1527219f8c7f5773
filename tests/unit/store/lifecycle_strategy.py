"""Hypothesis strategies: random but plausible lifecycle event sequences."""

from __future__ import annotations

from hypothesis import strategies as st

from gyre_store import (
    CellRole,
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    NewEvent,
    WeightsPublished,
)


@st.composite
def lifecycle_events(draw: st.DrawFn) -> list[NewEvent]:
    runs = draw(st.lists(st.sampled_from(["r1", "r2", "r3"]), min_size=1, max_size=2, unique=True))
    out: list[NewEvent] = []
    states: dict[str, str] = {}
    roles: dict[tuple[str, int], CellRole] = {}
    version: dict[str, int] = {}
    for _ in range(draw(st.integers(1, 60))):
        run = draw(st.sampled_from(runs))
        kind = draw(st.sampled_from(["dispatch", "start", "finish", "cell", "publish", "stray"]))
        if kind == "dispatch":
            eid = f"{run}-e{len(states)}"
            states[eid] = "queued"
            out.append(
                NewEvent(
                    ExecutionDispatched(
                        execution_id=eid,
                        run_id=run,
                        group_id=f"{run}-g{len(states) // 4}",
                        policy_version=version.get(run, 0),
                    )
                )
            )
        elif kind in ("start", "finish"):
            want = "queued" if kind == "start" else "running"
            candidates = sorted(e for e, s in states.items() if s == want and e.startswith(run))
            if not candidates:
                continue
            eid = draw(st.sampled_from(candidates))
            if kind == "start":
                states[eid] = "running"
                out.append(
                    NewEvent(
                        ExecutionStarted(
                            execution_id=eid, run_id=run, engine=draw(st.sampled_from(["c0", "c1"]))
                        )
                    )
                )
            else:
                states[eid] = "done"
                out.append(
                    NewEvent(
                        ExecutionFinished(
                            execution_id=eid, run_id=run, reason=draw(st.sampled_from(list(FinishReason)))
                        )
                    )
                )
        elif kind == "cell":
            cell = draw(st.integers(0, 2))
            prev = roles.get((run, cell), CellRole.ROLLOUT)
            new = CellRole.TRAINING if prev == CellRole.ROLLOUT else CellRole.ROLLOUT
            roles[(run, cell)] = new
            out.append(NewEvent(CellRoleChanged(run_id=run, cell_index=cell, role=new, previous=prev)))
        elif kind == "publish":
            version[run] = version.get(run, 0) + 1
            out.append(NewEvent(WeightsPublished(run_id=run, policy_version=version[run], step=version[run])))
        else:  # an event for an execution the log never saw dispatched
            out.append(
                NewEvent(ExecutionStarted(execution_id=f"{run}-stray{len(out)}", run_id=run, engine="c9"))
            )
    return out

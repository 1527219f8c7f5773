"""Child process for the crash tests: appends through gyre_store, then waits to be killed.

mode "mid-batch": streams a whole COPY batch inside its transaction, says READY, sleeps.
mode "loop": appends batches of 50 events forever, each tagged with its batch number.
"""

from __future__ import annotations

import sys
import time

from gyre_store import REGISTRY, NewEvent, PostgresEventLog, StoreConfig
from gyre_store.catalog import ExecutionDispatched


def batch_of(n: int, tag: str) -> list[NewEvent]:
    return [
        NewEvent(
            ExecutionDispatched(execution_id=f"{tag}-{i}", run_id="crash", group_id=tag, policy_version=0)
        )
        for i in range(n)
    ]


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    with PostgresEventLog(StoreConfig(url, copy_threshold=8)) as log:
        if mode == "mid-batch":
            encoded = [REGISTRY.encode(e) for e in batch_of(500, "killed")]
            with log.pool.connection() as conn, conn.transaction():
                head = log.lock_and_head(conn)
                results = log.plan_copy(conn, encoded, head)
                log.copy_rows(conn, encoded, results)
                print("READY", flush=True)
                time.sleep(600)
        else:
            k = 0
            while True:
                log.append(batch_of(50, f"b{k}"))
                print(f"BATCH {k}", flush=True)
                k += 1


if __name__ == "__main__":
    main()

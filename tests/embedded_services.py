"""Start embedded PostgreSQL and Redis for a test run on a machine that has neither.

``python -m tests.embedded_services ENV_FILE`` writes ``export GYRE_TEST_PG=...`` and
``export GYRE_TEST_REDIS=...`` to ENV_FILE once both answer, then keeps them up until
killed.
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

from gyre_store import until_signal
from gyre_store.db import services


def main() -> None:
    env_file = Path(sys.argv[1])
    data = Path(tempfile.mkdtemp(prefix="gyre-test-services-"))
    stop = until_signal([signal.SIGTERM])
    with services(None, None, data) as svc:
        admin = svc.database_url.replace("/gyre?", "/postgres?", 1)
        env_file.write_text(f"export GYRE_TEST_PG='{admin}'\nexport GYRE_TEST_REDIS='{svc.redis_url}'\n")
        stop.wait()


if __name__ == "__main__":
    main()

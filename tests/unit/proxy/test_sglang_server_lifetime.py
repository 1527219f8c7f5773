"""An SGLang server outlives the thread that started it, and not the process.

The server process asks Linux for SIGTERM when its parent goes (``PR_SET_PDEATHSIG``), and Linux
sends it when the *thread* that forked it ends. A stand-in server (a tiny HTTP server answering
``/health``, started the way SGLang is) is started from a short-lived thread: it must still be
running once that thread has ended.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from gyre_proxy.engines import SGLangServer, SGLangServerConfig

STAND_IN = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Health).serve_forever()
"""


def test_a_server_started_from_a_thread_that_ends_keeps_running(tmp_path: Path) -> None:
    server = SGLangServer(SGLangServerConfig(command=(sys.executable, "-c", STAND_IN), model_dir=tmp_path))
    starter = threading.Thread(target=server.__enter__)
    starter.start()
    starter.join(60)
    process = server.process
    try:
        assert process is not None and server.started_s is not None
        time.sleep(1.0)  # a parent-death SIGTERM would have ended it by now
        assert process.poll() is None
    finally:
        server.stop()
    assert process.poll() is not None

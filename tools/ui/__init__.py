"""``gyre ui``: a web view of runs, steps, executions and trajectory trees, served from the store.

Pages are rendered on the server (FastAPI, Jinja2 templates in ``templates/``, charts and trees
as inline SVG); nothing is fetched from elsewhere. Any page takes ``?at=<log position>`` and
then shows the store as it was when the log's head was there.
"""

from __future__ import annotations

import argparse
from typing import Any

from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, console, open_store


def register(subparsers: Any) -> None:
    ui = subparsers.add_parser("ui", help="serve the web view of runs and trajectory trees")
    add_store_arguments(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ui.add_argument("--port", type=int, default=8400, help="port to listen on")
    add_env_argument(
        ui,
        "--model",
        "GYRE_UI_MODEL",
        help="checkpoint folder whose tokenizer.json decodes messages (unset: the run's checkpoint "
        "when it has one, else the bundled Qwen3.6 vocabulary)",
    )
    ui.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gyre_store import PostgresProjectionStore
    from gyre_tools.common import all_projections
    from gyre_tools.ui.app import create_app

    with open_store(args) as opened:
        store = PostgresProjectionStore(opened.log.pool, all_projections().tables())
        app = create_app(opened.log, store=store, model=args.model)
        console.print(f"gyre ui: http://{args.host}:{args.port}/ (Ctrl-C stops it)")
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0

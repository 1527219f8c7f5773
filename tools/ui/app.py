"""The web view's FastAPI application: one route per page, each rendered on the server from the
store as of ``?at=<log position>`` (the head when absent), with Jinja2 templates beside it.

A page that shows the head polls ``/api/head`` and swaps in its own fresh rendering when the
log moves, so a running run's pages follow it; a page at a position is a replay and never
changes. The app holds the log it was given and nothing else: no cache of the store's state.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.templating import Jinja2Templates

from gyre_store import ConfigError, EventLog, NoTrajectoryTree, ProjectionStore, RunStarted
from gyre_tools.ui import svg
from gyre_tools.ui.pages import admitted, node_messages, tokenizer_for
from gyre_tools.ui.reading import (
    LogAt,
    UnknownRun,
    UnknownStep,
    at_position,
    execution_page,
    model_call,
    run_page,
    run_started,
    runs,
    step_page,
)

TEMPLATES = Path(__file__).with_name("templates")
POLL_S = 3.0  # how often a page at the head asks whether the log moved


def create_app(
    log: EventLog, *, store: ProjectionStore | None = None, model: str | None = None, poll_s: float = POLL_S
) -> FastAPI:
    """The view of ``log``. ``store``: the tree projection's store, which pages at the head
    read trees from (caught up first); without it every tree is folded from its records.
    ``model``: a checkpoint folder whose tokenizer decodes messages (None: each run's own
    checkpoint when it has a tokenizer.json, else the bundled vocabulary)."""
    app = FastAPI(title="gyre", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(TEMPLATES))
    templates.env.filters["fields"] = lambda event: msgspec.json.encode(event).decode()
    templates.env.globals["provenance_colours"] = {
        p.name.lower(): c for p, c in svg.PROVENANCE_COLOURS.items()
    }

    def page(request: Request, name: str, lv: LogAt, at: int | None, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(
            request,
            name,
            {"position": lv.at, "replay": at is not None, "head": log.head(), "link": page_link(at, lv), "q": quote,
             "poll_ms": int(poll_s * 1000), "path": request.url.path, **context},
        )  # fmt: skip

    def missing(request: Request, lv: LogAt, at: int | None, what: str) -> HTMLResponse:
        response = page(request, "error.html", lv, at, message=what)
        response.status_code = 404
        return response

    @app.exception_handler(ConfigError)
    async def bad_input(request: Request, exc: ConfigError) -> HTMLResponse:
        return HTMLResponse(f"<!doctype html><title>gyre</title><p>{escape(str(exc))}</p>", status_code=400)

    @app.get("/api/head")
    def head() -> JSONResponse:
        return JSONResponse({"head": log.head()})

    @app.get("/health")
    def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request, at: int | None = None) -> HTMLResponse:
        lv = at_position(log, at)
        return page(request, "runs.html", lv, at, runs=runs(lv))

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run(request: Request, run_id: str, at: int | None = None) -> HTMLResponse:
        lv = at_position(log, at)
        try:
            data = run_page(lv, run_id)
        except UnknownRun as exc:
            return missing(request, lv, at, str(exc))
        link = page_link(at, lv)
        report = data.report
        rewards = [
            svg.Point(s.step, s.mean_reward, link(f"/runs/{quote(run_id)}/steps/{s.step}"), f"step {s.step}")
            for s in report.steps
            if s.mean_reward is not None
        ]
        held = [(h.pass_rate, f"{h.name} pass rate", c) for h, c in zip(report.held_out, ("#7f7f7f", "#2ca02c"), strict=False)
                if h.pass_rate is not None]  # fmt: skip
        staleness = [
            svg.Point(s.step, s.staleness_mean) for s in report.steps if s.staleness_mean is not None
        ]
        transitions = [
            (span.cell, span.start_s) for span in report.role_timeline if span.role == "transitioning"
        ]
        charts = {
            "reward": svg.line_chart({"mean reward": rewards}, xlabel="training step", ylabel="reward",
                                     hlines=held, css_id="reward-chart"),
            "staleness_steps": svg.line_chart({"mean d of the step's groups": staleness}, xlabel="training step",
                                              ylabel="staleness d", hlines=[(report.staleness.expected_mean, "E[d]",
                                              "#d62728")], css_id="staleness-chart"),
            "staleness": svg.histogram(
                {"groups, at dispatch": report.staleness.histogram,
                 "model calls, engine-reported": report.staleness.engine_histogram},
                expected=report.staleness.expected_mean, measured=report.staleness.measured_mean,
                xlabel="staleness d = v_t - v_d"),
            "waterlevel": svg.line_chart({"w = d - f": [svg.Point(t, w) for t, w in data.waterlevel]},
                                         xlabel="seconds since the run started", ylabel="waterlevel w",
                                         steps=True, css_id="waterlevel-chart"),
            "roles": svg.role_timeline([(s.cell, s.role, s.start_s, s.end_s) for s in report.role_timeline],
                                       transitions),
            "cells": svg.stacked_parts([(c.name, c.span_s, c.parts) for c in data.cells.trainers + data.cells.engines]),
        }  # fmt: skip
        return page(request, "run.html", lv, at, run=data, report=report, charts=charts)

    @app.get("/runs/{run_id}/steps/{step}", response_class=HTMLResponse)
    def step(request: Request, run_id: str, step: int, at: int | None = None) -> HTMLResponse:
        lv = at_position(log, at)
        try:
            data = step_page(lv, run_id, step)
            figures = next(s for s in run_page(lv, run_id).report.steps if s.step == step)
        except (UnknownRun, UnknownStep) as exc:
            return missing(request, lv, at, str(exc))
        return page(request, "step.html", lv, at, step=data, figures=figures)

    # Execution ids hold "/" (run/e0): the node route is tried first.
    @app.get("/executions/{execution_id:path}/nodes/{node_id}", response_class=HTMLResponse)
    def node(request: Request, execution_id: str, node_id: int, at: int | None = None) -> HTMLResponse:
        lv = at_position(log, at)
        data = execution_page(lv, execution_id, store)
        view = data.tree
        if view is None or node_id not in view.nodes:
            return missing(request, lv, at, f"no node {node_id} in the tree of {execution_id!r} (as of log "
                           f"position {lv.at})")  # fmt: skip
        started = run_started(lv, data.run_id) if data.run_id else None
        run_model = (
            started.event.model if started is not None and isinstance(started.event, RunStarted) else None
        )
        tok = tokenizer_for(model or run_model)
        replay = admitted(lv, data.run_id or "", view, data.consumed)
        n = view.nodes[node_id]
        kids = sorted(m.node_id for m in view.nodes.values() if m.parent_id == node_id)
        record = view.records.get(n.request_id)
        call = model_call(lv, execution_id, n.request_id)
        ending = [r for r in view.records.values() if r.end_node == node_id]
        return page(
            request, "node.html", lv, at, ex=data, view=view, node=n, path=view.path(node_id), children=kids,
            messages=node_messages(view, node_id, tok), tokenizer=tok.name, record=record,
            call=call, ending=ending,
            draws=[t for t in (replay.trajectories if replay else []) if node_id in t.target_nodes],
            leaf_draws=[t for t in (replay.trajectories if replay else []) if t.leaf == node_id],
        )  # fmt: skip

    @app.get("/executions/{execution_id:path}", response_class=HTMLResponse)
    def execution(request: Request, execution_id: str, at: int | None = None) -> HTMLResponse:
        lv = at_position(log, at)
        data = execution_page(lv, execution_id, store)
        if not data.lifecycle and data.tree is None and not data.evaluation:
            return missing(request, lv, at, f"no execution {execution_id!r} (as of log position {lv.at})")
        replay = None
        targets: dict[int, int] = {}
        drawing = ""
        if data.tree is not None:
            replay = admitted(lv, data.run_id or "", data.tree, data.consumed)
            for t in replay.trajectories if replay else []:
                targets.update(dict.fromkeys(t.target_nodes, t.draw))
            node_link = page_link(at, lv)
            drawing = svg.tree(
                data.tree, lambda n: node_link(f"/executions/{quote(execution_id)}/nodes/{n}"), targets
            )
        return page(request, "execution.html", lv, at, ex=data, admission=replay, drawing=drawing,
                    stats=data.tree.stats() if data.tree else None,
                    candidates=data.tree.candidates() if data.tree else [])  # fmt: skip

    @app.exception_handler(NoTrajectoryTree)
    async def no_tree(request: Request, exc: NoTrajectoryTree) -> HTMLResponse:
        return HTMLResponse(f"<!doctype html><title>gyre</title><p>{escape(str(exc))}</p>", status_code=404)

    return app


def page_link(at: int | None, lv: LogAt) -> Callable[[str], str]:
    """Links that keep a replay at its position (and pages at the head at the head)."""
    return lambda path: path if at is None else f"{path}?at={lv.at}"

"""Answering one harness call: ``AnswerPipeline`` (the ``Answerer`` gyre runs) routes it to
an engine, streams the parsed answer back and stages its TITO record, continuing on another
engine when one fails mid-answer. Its decisions are a pure ``AnswerMachine``; the pipeline
is the async shell. Not here: HTTP (``api``), tokenizing requests (``ingest``), engines.
"""

from __future__ import annotations

from gyre_proxy.answer.machine import (
    MAX_ATTEMPTS,
    AnswerMachine,
    Attempt,
    GiveUp,
    Reroute,
    Stage,
    StopEngine,
)
from gyre_proxy.answer.output_parser import (
    JsonToolCallParser,
    OutputParser,
    parse_output,
    parse_tool_call,
    parser_for,
    stop_reason_for,
)
from gyre_proxy.answer.pipeline import AnswerObserver, AnswerPipeline, ExecutionSync
from gyre_proxy.answer.routing import Binding, Lookup, RoutedEngine, Router

__all__ = [
    "MAX_ATTEMPTS",
    "AnswerMachine",
    "AnswerObserver",
    "AnswerPipeline",
    "Attempt",
    "Binding",
    "ExecutionSync",
    "GiveUp",
    "JsonToolCallParser",
    "Lookup",
    "OutputParser",
    "Reroute",
    "RoutedEngine",
    "Router",
    "Stage",
    "StopEngine",
    "parse_output",
    "parse_tool_call",
    "parser_for",
    "stop_reason_for",
]

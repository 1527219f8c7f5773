"""Executions as Harbor ATIF v1.4 trajectories (``gyre export --format atif``).

Every candidate trajectory (leaf) of an execution becomes one ATIF document. The store keeps
token ids, not the harness's JSON, so messages are decoded from the recorded tokens with the
policy's tokenizer and a model call's output is parsed as the proxy parses an engine's answer:
the text is what the model saw and wrote. Not here: choosing which run, writing the file.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import IO, Any

import msgspec
import numpy as np
from rich.progress import Progress

from gyre_proxy.answer import parse_output
from gyre_proxy.chat import TextBlock, ThinkingBlock, ToolUseBlock
from gyre_proxy.engines import Tokenizer
from gyre_store import PostgresEventLog, PostgresProjectionStore, Provenance, RunStarted, StreamId
from gyre_store.trees import Candidate, TreeRecord, TreeView
from gyre_tools.common import console

ATIF_VERSION = "ATIF-v1.4"
_SAMPLED, _TEMPLATE = int(Provenance.SAMPLED), int(Provenance.TEMPLATE)
# Tokens that end a turn in the template families the proxy knows (qwen, llama3): sampled, but
# markup, not the message.
TURN_ENDS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def message_spans(view: TreeView, path: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) path offsets of each message on ``path``: the recorded message ends, and each
    record output on the path as a span of its own."""
    end = view.nodes[path[-1]].end
    on_path = set(path)
    cuts = {0, end}
    for node_id in path:
        cuts.update(int(e) for e in view.nodes[node_id].msg_ends)
    for record in view.records.values():
        if record.end_node in on_path and record.output_len:
            cuts.update((record.input_len, record.input_len + record.output_len))
    ordered = sorted(c for c in cuts if 0 <= c <= end)
    return list(itertools.pairwise(ordered))


def _content(tok: Tokenizer, ids: np.ndarray[Any, Any], prov: np.ndarray[Any, Any]) -> str:
    """The text of a harness-supplied message: its tokens without the template's markup."""
    return tok.decode(ids[prov != _TEMPLATE].tolist()).strip()


def _runs(prov: np.ndarray[Any, Any], code: int) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of ``code`` in ``prov`` (each tool result of a message)."""
    flags = np.concatenate([[False], prov == code, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(flags))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def agent_fields(tok: Tokenizer, text: str, thinking_open: bool, call_prefix: str) -> dict[str, Any]:
    """message, reasoning_content and tool_calls of an assistant output, parsed as the proxy
    parses what an engine samples (Hermes ``<tool_call>`` JSON; reasoning in ``<think>``)."""
    counter = iter(range(1_000_000))
    parsed = parse_output(
        text, thinking_open=thinking_open, id_factory=lambda: f"{call_prefix}{next(counter)}"
    )
    fields: dict[str, Any] = {
        "message": "\n\n".join(b.text for b in parsed.blocks if isinstance(b, TextBlock))
    }
    reasoning = "\n\n".join(b.thinking for b in parsed.blocks if isinstance(b, ThinkingBlock))
    if reasoning:
        fields["reasoning_content"] = reasoning
    calls = []
    for block in parsed.blocks:
        if isinstance(block, ToolUseBlock):
            try:
                arguments = json.loads(block.input_json or "{}")
            except json.JSONDecodeError:
                arguments = None
            if not isinstance(arguments, dict):
                arguments = {"input": block.input_json}
            calls.append({"tool_call_id": block.id, "function_name": block.name, "arguments": arguments})
    if calls:
        fields["tool_calls"] = calls
    return fields


def atif_document(
    view: TreeView, candidate: Candidate, tok: Tokenizer, *, agent: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    """One candidate trajectory (its root-to-leaf path) as an ATIF document.

    Each recorded message becomes a step: system and user messages as ``system``/``user`` steps
    (evaluator critique as a ``user`` step marked in ``extra``), a record's output as an
    ``agent`` step with its token ids and behaviour logprobs in ``metrics``, harness-supplied
    assistant text as an ``agent`` step marked ``injected_assistant``, and tool results as the ``observation``
    of the agent step before them (matched to its tool calls in order: the tokens hold no ids).
    """
    path = list(candidate.path)
    ids, prov = view.sequence(candidate.leaf)
    outputs = {(r.input_len, r.input_len + r.output_len): r for r in view.records.values() if r.output_len}
    ends = {tok.specials[t] for t in TURN_ENDS if t in tok.specials}
    steps: list[dict[str, Any]] = []
    last_agent: dict[str, Any] | None = None
    prompt_total = completion_total = 0
    for start, end in message_spans(view, path):
        seg_ids, seg_prov = ids[start:end], prov[start:end]
        content = seg_prov[seg_prov != _TEMPLATE]
        kind = int(np.bincount(content).argmax()) if content.size else _TEMPLATE
        record: TreeRecord | None = outputs.get((start, end))
        step: dict[str, Any]
        if record is not None or kind in (_SAMPLED, Provenance.INJECTED_ASSISTANT):
            body = seg_ids
            if record is None:  # an assistant message in a later context: drop the role header
                inside = np.flatnonzero(seg_prov != _TEMPLATE)
                body = seg_ids[int(inside[0]) : int(inside[-1]) + 1]
            while body.size and int(body[-1]) in ends:
                body = body[:-1]
            before = tok.decode(ids[max(0, start - 4) : start].tolist())
            step = {"source": "agent"} | agent_fields(
                tok,
                tok.decode(body.tolist()),
                thinking_open=before.rstrip().endswith("<think>"),
                call_prefix=f"{record.request_id if record else start}-call-",
            )
            if record is not None:
                _, logprobs = view.output_of(record.request_id)
                step["metrics"] = {
                    "prompt_tokens": record.input_len,
                    "completion_tokens": record.output_len,
                    "completion_token_ids": seg_ids.tolist(),
                }
                if bool((seg_prov == _SAMPLED).all()) and bool(np.isfinite(logprobs).all()):
                    step["metrics"]["logprobs"] = logprobs.tolist()  # behaviour logprobs, per token
                step["extra"] = {"request_id": record.request_id, "finish": record.finish}
                prompt_total += record.input_len
                completion_total += record.output_len
            elif kind == Provenance.INJECTED_ASSISTANT:
                step["extra"] = {"injected_assistant": True}
            last_agent = step
        elif not content.size:
            continue  # template markup only (a generation prompt)
        else:
            if kind == Provenance.TOOL_RESULT and last_agent is not None:
                calls = last_agent.get("tool_calls", [])
                results = last_agent.setdefault("observation", {"results": []})["results"]
                for a, b in _runs(seg_prov, kind):
                    result: dict[str, Any] = {"content": tok.decode(seg_ids[a:b].tolist()).strip()}
                    if len(results) < len(calls):
                        result["source_call_id"] = calls[len(results)]["tool_call_id"]
                    results.append(result)
                continue
            source = "system" if kind == Provenance.SYSTEM else "user"
            step = {"source": source, "message": _content(tok, seg_ids, seg_prov)}
            if kind not in (Provenance.USER, Provenance.SYSTEM):  # critique, or an unanswered tool result
                step["extra"] = {"provenance": Provenance(kind).name.lower()}
        steps.append(step)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": f"{view.execution_id}/{candidate.request_id}",
        "agent": agent,
        "steps": [{"step_id": number, **step} for number, step in enumerate(steps, start=1)],
        "final_metrics": {
            "total_prompt_tokens": prompt_total,
            "total_completion_tokens": completion_total,
            "total_steps": len(steps),
        },
        "extra": extra,
    }


def write_atif(
    log: PostgresEventLog, store: PostgresProjectionStore, run_id: str, tok: Tokenizer, out: IO[str]
) -> int:
    """Every candidate trajectory of every execution of the run, one ATIF document per line."""
    started = next(
        (r.event for r in log.read_stream(StreamId("run", run_id)) if isinstance(r.event, RunStarted)), None
    )
    executions = sorted({str(r["execution_id"]) for r in store.select("gyre_tree_records", "run_id", run_id)})
    groups = {
        str(r["execution_id"]): str(r["group_id"])
        for eid in executions
        for r in store.select("gyre_group_members", "execution_id", eid)
    }
    count = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("executions", total=len(executions))
        for execution_id in executions:
            view = TreeView.load(store, execution_id)
            agent = {"name": started.harness if started is not None else "unknown", "version": "unknown"}
            if started is not None:
                agent["model_name"] = started.model
            for candidate in sorted(view.candidates(), key=lambda c: view.records[c.request_id].seq):
                extra = {
                    "run_id": run_id,
                    "execution_id": execution_id,
                    "group_id": groups.get(execution_id),
                    "leaf_request_id": candidate.request_id,
                    "leaf_class": candidate.leaf_class.value,
                }
                document = atif_document(view, candidate, tok, agent=agent, extra=extra)
                out.write(msgspec.json.encode(document).decode() + "\n")
                count += 1
            progress.advance(task)
    return count

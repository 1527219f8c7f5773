"""Prefix matching on captured real harness histories: what each matching method reuses.

    .venv/bin/python benchmarks/measure_payload_cache.py

The fixtures in benchmarks/histories/ are the request bodies Claude Code 2.1.332 and Codex
0.171.0 sent to the proxy, in order, while the reference engine played the acceptance tests'
scripted policies (main agent, tool calls, a sub-agent, a compaction); product prompt text
is redacted to same-text-same-stand-in placeholders, which leaves matching unchanged. Each
history is replayed through the proxy's adapter and ingest path: the scripted policy answers
each request from the prompt the proxy built, as the engine did, and its tool calls take the
call ids the client sent back. A request is eligible when an earlier request's history and
answer open it (its predecessor); it is matched when its stored prefix ends exactly at the end
of the predecessor's stored output, so nothing stored is tokenized again. Methods:

- raw text: tool inputs compared as the client serialized them;
- canonical JSON: tool inputs compared as canonical JSON (the proxy before the cache);
- payload cache: generated calls restored to their sampled payload by call id, then canonical.

    .venv/bin/python benchmarks/measure_payload_cache.py --build NAME --api API --captured DIR \\
        --script SCRIPT.json

writes benchmarks/histories/NAME.jsonl.gz from a folder of captured bodies (NNN.json).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gyre_proxy.chat.messages as chat_messages
from gyre_proxy.answer import parse_output
from gyre_proxy.api import anthropic, openai_chat, openai_responses
from gyre_proxy.chat import ChatRequest, Message, Role, ToolUseBlock, canonical
from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.engines.refengine import ScriptedPolicy, load_tokenizer
from gyre_proxy.harness import plugin_for
from gyre_proxy.ingest import Ingestor, PayloadCache, Qwen3Template
from gyre_store import InMemoryEventLog
from gyre_store.catalog import CallFinish
from gyre_store.trees import TrajectoryRecorder

HISTORIES = Path(__file__).resolve().parent / "histories"
HARNESS = {"anthropic": "claude-code", "openai-responses": "codex", "openai-chat": "generic"}
METHODS = ("raw text", "canonical JSON", "payload cache")


class _NoCache(PayloadCache):
    """The proxy before the cache: nothing is remembered, so nothing is restored."""

    def remember(self, execution_id: str, assistant: Message) -> None:
        return None


def translate(api: str, body: dict[str, Any]) -> ChatRequest:
    raw = msgspec.json.encode(body)
    if api == "anthropic":
        return anthropic.to_chat_request(anthropic.MESSAGES_DECODER.decode(raw))
    if api == "openai-chat":
        return openai_chat.to_chat_request(openai_chat.COMPLETIONS_DECODER.decode(raw))
    return openai_responses.to_chat_request(openai_responses.RESPONSES_DECODER.decode(raw))[0]


def load(name: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    with gzip.open(HISTORIES / f"{name}.jsonl.gz", "rt") as f:
        head, *bodies = (json.loads(line) for line in f)
    return head["api"], head["script"], bodies


def predecessors(requests: list[ChatRequest]) -> list[int | None]:
    """For each request, the latest earlier one whose messages open it, followed by an answer."""
    keys = [[canonical(m) for m in r.messages] for r in requests]
    out: list[int | None] = []
    for k, key in enumerate(keys):
        found = None
        for j in range(k - 1, -1, -1):
            n = len(keys[j])
            if len(key) > n and key[:n] == keys[j] and requests[k].messages[n].role == Role.ASSISTANT:
                found = j
                break
        out.append(found)
    return out


def echoed_ids(requests: list[ChatRequest], preds: list[int | None], k: int) -> list[str]:
    """The call ids the client gave request ``k``'s answer, from the first request that carries it."""
    for j, p in enumerate(preds):
        if p == k:
            answer = requests[j].messages[len(requests[k].messages)]
            return [b.id for b in answer.blocks if isinstance(b, ToolUseBlock)]
    return []


def replay(
    api: str, script: dict[str, Any], bodies: list[dict[str, Any]], method: str
) -> tuple[int, int, int, list[int]]:
    """(matched, eligible, requests, the eligible requests not matched) for one history and method."""
    template = Qwen3Template(qwen_tokenizer())
    tok = template.tok
    policy = ScriptedPolicy.from_json(script, load_tokenizer(None, "qwen"))  # as the engine loads it
    payloads = PayloadCache() if method == "payload cache" else _NoCache()
    ing = Ingestor(
        TrajectoryRecorder(InMemoryEventLog()), template, plugin_for(HARNESS[api]), payloads=payloads
    )
    requests = [translate(api, b) for b in bodies]
    preds = predecessors(requests)
    full: dict[str, np.ndarray] = {}
    matched = eligible = 0
    missed: list[int] = []
    for k, request in enumerate(requests):
        prepared = ing.prepare("ex", "run", request)
        enc = prepared.encoded
        prefix = (
            np.zeros(0, np.int32) if enc.prefix is None else full[enc.prefix.request_id][: enc.prefix_len]
        )
        input_ids = np.concatenate([prefix, enc.new_ids]).astype(np.int32)
        forced = policy.next_output(tok.decode(input_ids.tolist()))
        assert forced is not None, "the script answers every prompt"
        output_ids = np.asarray(forced, np.int32)
        text = tok.decode([t for t in forced if t != template.im_end])
        ids = iter(echoed_ids(requests, preds, k))
        response = parse_output(
            text, thinking_open=False, id_factory=lambda ids=ids: next(ids, "toolu_unechoed")
        )
        ing.record(
            prepared, request_id=f"r{k}", output_ids=output_ids,
            output_logprobs=np.zeros(len(output_ids), np.float32),
            assistant=Message(Role.ASSISTANT, response.blocks), finish=CallFinish.STOP,
        )  # fmt: skip
        full[f"r{k}"] = np.concatenate([input_ids, output_ids])
        p = preds[k]
        if p is not None:
            eligible += 1
            point = enc.prefix
            hit = point is not None and point.request_id == f"r{p}" and point.offset == len(full[f"r{p}"])
            matched += hit
            if not hit:
                missed.append(k)
    return matched, eligible, len(requests), missed


def _why(before: ChatRequest, request: ChatRequest) -> str:
    """What makes a request's context differ from the start (with the payload cache)."""
    if request.tools != before.tools:
        return f"sent {len(request.tools)} tools where the history had {len(before.tools)}"
    if request.system != before.system:
        return "the system prompt changed"
    return "a message of the history changed"


def _raw_text(raw: str) -> str:
    return raw


def measure(name: str, method: str) -> tuple[int, int, int, list[int]]:
    api, script, bodies = load(name)
    saved: Callable[[str], str] = chat_messages._canonical_json
    if method == "raw text":
        # canonical() then compares tool inputs byte for byte, as sent.
        chat_messages._canonical_json = _raw_text  # type: ignore[assignment]
    try:
        return replay(api, script, bodies, method)
    finally:
        chat_messages._canonical_json = saved  # type: ignore[assignment]


# -- building a fixture from captured bodies -------------------------------------------------------


def _stand_in(text: str) -> str:
    return f"[redacted {hashlib.blake2b(text.encode(), digest_size=6).hexdigest()} {len(text)} chars]"


def _descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            k: _stand_in(v) if k == "description" and isinstance(v, str) else _descriptions(v)
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_descriptions(v) for v in schema]
    return schema


def _parts(content: Any) -> Any:
    if isinstance(content, str):
        return _stand_in(content)
    return [{**p, "text": _stand_in(p["text"])} if "text" in p else p for p in content]


def redact(body: dict[str, Any]) -> dict[str, Any]:
    """Product prompt text (system and developer texts, reminders, tool descriptions) replaced by
    stand-ins that are equal exactly when the texts are; everything the policy or matching reads
    from the conversation itself is kept."""
    body = dict(body)
    if isinstance(body.get("system"), str | list):
        body["system"] = _parts(body["system"])
    if isinstance(body.get("instructions"), str):
        body["instructions"] = _stand_in(body["instructions"])
    body["tools"] = [_descriptions(t) for t in body.get("tools") or []]
    key = "messages" if "messages" in body else "input"
    items = []
    for m in body.get(key) or []:
        if m.get("role") in ("system", "developer"):
            m = {**m, "content": _parts(m["content"])}
        elif m.get("role") == "user" and isinstance(m.get("content"), list):
            m = {**m, "content": [
                {**p, "text": _stand_in(p["text"])} if str(p.get("text", "")).startswith("<system-reminder>") else p
                for p in m["content"]
            ]}  # fmt: skip
        items.append(m)
    body[key] = items
    return body


def build(name: str, api: str, captured: Path, script: Path) -> Path:
    bodies = [json.loads(p.read_text()) for p in sorted(captured.glob("[0-9][0-9][0-9].json"))]
    HISTORIES.mkdir(exist_ok=True)
    out = HISTORIES / f"{name}.jsonl.gz"
    with gzip.open(out, "wt") as f:
        f.write(json.dumps({"api": api, "script": json.loads(script.read_text())}) + "\n")
        for b in bodies:
            f.write(json.dumps(redact(b), ensure_ascii=False) + "\n")
    return out


def fixtures() -> Iterator[str]:
    for p in sorted(HISTORIES.glob("*.jsonl.gz")):
        yield p.name.removesuffix(".jsonl.gz")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--build", help="write benchmarks/histories/NAME.jsonl.gz from --captured")
    parser.add_argument("--api", choices=sorted(HARNESS))
    parser.add_argument("--captured", type=Path)
    parser.add_argument("--script", type=Path)
    args = parser.parse_args()
    console = Console(width=160)
    if args.build:
        console.print(f"wrote {build(args.build, args.api, args.captured, args.script)}")
        return 0
    table = Table(title="requests whose stored prefix ends at their predecessor's stored output")
    table.add_column("history")
    table.add_column("requests", justify="right")
    for method in METHODS:
        table.add_column(method, justify="right")
    table.add_column("not matched (request: why)")
    for name in fixtures():
        cells = []
        total = 0
        missed: list[int] = []
        for method in METHODS:
            matched, eligible, total, missed = measure(name, method)
            cells.append(f"{matched}/{eligible} ({matched / max(eligible, 1):.0%})")
        api, _, bodies = load(name)
        requests = [translate(api, b) for b in bodies]
        preds = predecessors(requests)
        why = [f"{k}: {_why(requests[p], requests[k])}" for k in missed if (p := preds[k]) is not None]
        table.add_row(name, str(total), *cells, "; ".join(why) or "-")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

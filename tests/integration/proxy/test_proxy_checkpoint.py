"""The proxy on a checkpoint's own tokenizer and template, end to end over HTTP.

For each family's tiny checkpoint: a reference engine serves the checkpoint (``gyre engine
serve --model DIR`` does the same) with a script that answers in the family's own tool-call
syntax; the proxy renders with the checkpoint (``gyre proxy serve --model DIR``); the official
OpenAI SDK runs a two-turn tool loop. The first call's recorded input ids equal the
checkpoint's ``apply_chat_template(..., tokenize=True, add_generation_prompt=True)``; the
second extends the first's input and sampled output verbatim, and its new ids are the
template's own text for the tool result and the generation prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from gyre_proxy.chat import Message, Role, TextBlock, ToolUseBlock
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.ingest import load_chat_format
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key
from gyre_store import InMemoryEventLog, InMemoryProjectionStore, catch_up
from gyre_store.trees import TreeProjection, TreeView
from tests.checkpoints import family_checkpoint, template_ids, template_text  # noqa: F401

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@pytest.fixture(params=["qwen3", "qwen3.6", "llama3"])
def served(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    family_checkpoint: Callable[[str], Path],  # noqa: F811
) -> Iterator[tuple[Path, ProxyService]]:
    folder = family_checkpoint(request.param)
    fmt = load_chat_format(folder)
    call = Message(
        Role.ASSISTANT, (TextBlock("Let me look."), ToolUseBlock("c", "Bash", '{"command": "ls -la"}'))
    )
    # The engine speaks the family's syntax: the script is the family's own rendering of a call.
    said = fmt.tok.decode([i for i in fmt.render_output(call).ids if i not in fmt.stop_ids])
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"outputs": [said, "All done."], "rule": "in_order"}))
    engine_config = ReferenceEngineConfig(
        source=ModelSource(model_dir=folder), max_context=4096, script=script
    )
    with ReferenceEngineServer(engine_config) as engine:
        config = ProxyConfig(engines=[("engine", engine.base_url)], context_limit=4096, model_dir=folder)
        with ProxyService(InMemoryEventLog(), config) as proxy:
            yield folder, proxy


def test_a_tool_loop_on_a_checkpoint_records_its_own_template_ids(served: tuple[Path, ProxyService]) -> None:
    from transformers import AutoTokenizer

    folder, proxy = served
    hf = AutoTokenizer.from_pretrained(str(folder))
    key = issue_key(proxy.log, execution_id="ex", run_id="run", harness="generic")
    client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key=key, max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is here?"},
    ]
    first = client.chat.completions.create(model="gyre", messages=messages, tools=TOOLS, max_tokens=200)  # type: ignore[arg-type]
    (call,) = first.choices[0].message.tool_calls or []
    assert call.function.name == "Bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content or "",
         "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "Bash", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"},
    ]  # fmt: skip
    second = client.chat.completions.create(model="gyre", messages=messages, tools=TOOLS, max_tokens=200)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "All done."

    assert proxy.spool.flush(30)
    projection = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in projection.tables}, proxy.log)
    catch_up(proxy.log, store, projection)
    view = TreeView.load(store, "ex")
    r1, r2 = sorted(view.records.values(), key=lambda r: r.seq)
    in1, out1 = view.input_of(r1.request_id)[0], view.output_of(r1.request_id)[0]
    in2, (out2, lp2) = view.input_of(r2.request_id)[0], view.output_of(r2.request_id)
    expected = template_ids(hf, messages[:2], TOOLS)
    assert in1.tolist() == list(expected)
    # Turn 2: the stored input and the sampled answer verbatim, then only the new text.
    stored = np.concatenate([in1, out1])
    np.testing.assert_array_equal(in2[: len(stored)], stored)
    new = in2[len(stored) :].tolist()
    fmt = load_chat_format(folder)
    assert int(out1[-1]) in fmt.end_ids
    whole = template_text(hf, messages, TOOLS)
    ends = sorted(
        p + len(t) for t in (hf.convert_ids_to_tokens(i) for i in fmt.end_ids)
        for p in range(len(whole)) if whole.startswith(t, p)
    )  # fmt: skip
    new_text = whole[ends[2] :]  # after the system, user and assistant turns
    assert hf.decode(new) == new_text
    assert new == hf.encode(new_text, add_special_tokens=False)
    assert len(out2) > 0 and np.all(lp2 <= 0)

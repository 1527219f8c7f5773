"""`gyre engine serve --model DIR` and `gyre proxy serve --model DIR` as a user starts them, on a
checkpoint written by `gyre checkpoint write`: one Anthropic SDK call, recorded with the ids the
checkpoint's own `apply_chat_template` gives; and a checkpoint that cannot be loaded stops the
proxy with one line naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anthropic

from gyre_proxy.engines.refengine import free_port
from gyre_store import PostgresEventLog, StoreConfig
from gyre_store.catalog import ModelCallRecorded, TitoArrays
from gyre_store.log import StreamId
from tests.acceptance.conftest import ROOT, gyre
from tests.acceptance.processes import gyre_process
from tests.checkpoints import template_ids


def test_engine_and_proxy_on_a_checkpoint_record_its_template_ids(
    fresh_database_url: str, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    folder = tmp_path / "ckpt"
    written = gyre("checkpoint", "write", "--family", "qwen3", str(folder))
    assert written.returncode == 0, written.stderr
    env = {"GYRE_DATABASE_URL": fresh_database_url}
    engine_port = free_port()
    with (
        gyre_process(["engine", "serve", "--model", str(folder)], tmp_path / "engine.log", env, engine_port),
        gyre_process(
            ["proxy", "serve", "--model", str(folder), "--engine", f"e0=http://127.0.0.1:{engine_port}"],
            tmp_path / "proxy.log", env,
        ) as (proxy_url, _),
    ):  # fmt: skip
        registered = gyre(
            "executions", "new", "--harness", "claude-code", "--json", "--proxy-url", proxy_url, env=env
        )
        assert registered.returncode == 0, registered.stderr
        execution = json.loads(registered.stdout)
        with anthropic.Anthropic(
            base_url=execution["base_url"], api_key=execution["api_key"], max_retries=0, timeout=300
        ) as client:
            answer = client.messages.create(
                model="gyre-policy", max_tokens=8, system="You are careful.",
                messages=[{"role": "user", "content": "List the files."}],
            )  # fmt: skip
    assert 0 < answer.usage.output_tokens <= 8
    with PostgresEventLog(StoreConfig(fresh_database_url)) as log:
        (recorded,) = log.read_stream(StreamId("calls", execution["execution_id"]))
    assert isinstance(recorded.event, ModelCallRecorded)
    arrays = TitoArrays.from_payload(recorded.payload)
    hf = AutoTokenizer.from_pretrained(str(folder))
    expected = template_ids(
        hf,
        [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "List the files."}],
    )
    assert arrays.input_ids.tolist() == expected


def test_a_checkpoint_without_a_template_stops_the_proxy_with_one_line(
    fresh_database_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{not json")
    done = subprocess.run(
        [sys.executable, "-m", "gyre_tools.cli", "proxy", "serve", "--model", str(folder), "--engine",
         "e0=http://127.0.0.1:9", "--port", str(free_port()), "--spool-dir", str(tmp_path / "spool")],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin", "GYRE_DATABASE_URL": fresh_database_url},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gyre proxy serve:") and str(folder / "tokenizer.json") in last, done.stderr

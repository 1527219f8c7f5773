"""Engines the contract suite runs against: gyre's reference engine, and real SGLang.

The SGLang target needs ``GYRE_SGLANG_URL`` (a server started by ``tools/run-tests.sh`` or
``tools/sglang_setup.sh``) and ``GYRE_SGLANG_MODEL_DIR`` (the model folder it serves, for direct
forward passes); without them its tests fail (see ``tests/real_servers.py``). They are read
when this module is imported because the root conftest clears ``GYRE_*`` variables before
every test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
import torch

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer, load_model
from gyre_proxy.engines.weights import GYRE_SAFETENSORS_FORMAT
from tests.real_servers import unavailable

SGLANG_URL = os.environ.get("GYRE_SGLANG_URL")
SGLANG_MODEL_DIR = os.environ.get("GYRE_SGLANG_MODEL_DIR")
SGLANG_CONTEXT_LENGTH = int(os.environ.get("GYRE_SGLANG_CONTEXT_LENGTH", "2048"))

REFERENCE_CONTEXT = 2048


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(frozen=True)
class EngineTarget:
    """An engine under test and what the suite needs to check it."""

    name: str
    base_url: str
    model: torch.nn.Module  # the same weights, for direct forward passes
    context_length: int
    eos_token_ids: frozenset[int]
    gyre_admin: bool  # has the /gyre/... admission endpoints
    # How far its logprobs may sit from a float32 transformers forward pass. The reference
    # engine runs that very forward; SGLang's CPU kernels (fused norms, its own attention,
    # batched decode) sum in another order: up to 1.25e-3 was seen on SGLang 0.5.23.
    logprob_atol: float = 1e-4
    # The load_format its /update_weights_from_tensor takes (None: SGLang's pickled payload).
    tensor_load_format: str | None = GYRE_SAFETENSORS_FORMAT


@pytest.fixture(scope="module")
def reference_target() -> Iterator[EngineTarget]:
    config = ReferenceEngineConfig(max_context=REFERENCE_CONTEXT, seed=0)
    with ReferenceEngineServer(config) as server:
        loaded = server.engine.loaded
        yield EngineTarget(
            name="reference",
            base_url=server.base_url,
            model=loaded.model,
            context_length=server.engine.context_length,
            eos_token_ids=loaded.eos_token_ids,
            gyre_admin=True,
        )


@pytest.fixture(scope="module")
def sglang_target() -> EngineTarget:
    if not SGLANG_URL or not SGLANG_MODEL_DIR:
        unavailable(
            "sglang",
            "NO REAL SGLANG SERVER: set GYRE_SGLANG_URL and GYRE_SGLANG_MODEL_DIR "
            "(see tools/sglang_setup.sh and docs/engines.md) to run the contract suite against SGLang",
        )
    loaded = load_model(ModelSource(model_dir=Path(SGLANG_MODEL_DIR)))
    return EngineTarget(
        name="sglang",
        base_url=SGLANG_URL,
        model=loaded.model,
        context_length=SGLANG_CONTEXT_LENGTH,
        eos_token_ids=loaded.eos_token_ids,
        gyre_admin=False,
        logprob_atol=2e-3,
        tensor_load_format=None,
    )


@pytest.fixture(params=["reference", pytest.param("sglang", marks=pytest.mark.sglang)])
def target(request: pytest.FixtureRequest) -> EngineTarget:
    name = "reference_target" if request.param == "reference" else "sglang_target"
    value: EngineTarget = request.getfixturevalue(name)
    return value


@pytest.fixture(autouse=True)
def _close_sdk_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SDK clients keep pooled connections open: close every one a test made."""
    made: list[anthropic.Anthropic | openai.OpenAI] = []
    for cls in (anthropic.Anthropic, openai.OpenAI):
        original = cls.__init__

        def init(self: object, *a: object, _orig: object = original, **k: object) -> None:
            _orig(self, *a, **k)  # type: ignore[operator]
            made.append(self)  # type: ignore[arg-type]

        monkeypatch.setattr(cls, "__init__", init)
    yield
    for client in made:
        client.close()

"""KV-cache migration pieces: packing and unpacking the payload, the pinned and prefix stores,
and the client's typed errors (mock transport)."""

from __future__ import annotations

import httpx
import msgspec
import numpy as np
import pytest
import torch
from safetensors.torch import save

from gyre_proxy.engines import (
    EngineBadRequest,
    EngineClient,
    EngineClientConfig,
    KvCacheFull,
    KvCacheIncompatible,
    KvCacheNotFound,
    KvMigrationUnsupported,
    KvPayload,
)
from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.refengine import DEFAULT_MODEL_CONFIG, LoadedModel, ModelSource, load_model
from gyre_proxy.engines.refengine.kvcache import (
    CacheLayout,
    KvEntry,
    cache_from_entry,
    cache_layout,
    entry_from_cache,
)
from gyre_proxy.engines.refengine.kvpayload import pack, unpack
from gyre_proxy.engines.refengine.kvstore import KvLimits, PinnedCaches, PrefixCache
from gyre_proxy.exceptions import KvStoreFull, PayloadIncompatible, PinNotFound

VOCAB = int(DEFAULT_MODEL_CONFIG["vocab_size"])


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(ModelSource(seed=0))


@pytest.fixture(scope="module")
def layout(loaded: LoadedModel) -> CacheLayout:
    found = cache_layout(loaded.model)
    assert found is not None
    return found


def prefill(loaded: LoadedModel, ids: list[int]) -> tuple[object, torch.Tensor]:
    """A cache over ``ids`` and the logits of the position after them."""
    from transformers import DynamicCache

    cache = DynamicCache(config=loaded.model.config)  # type: ignore[arg-type]
    with torch.inference_mode():
        out = loaded.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache, out.logits[0, -1]


def real_entry(loaded: LoadedModel, layout: CacheLayout, ids: list[int], rid: str = "r") -> KvEntry:
    cache, _ = prefill(loaded, ids)
    return entry_from_cache(cache, ids, rid=rid, weight_version="default", layout=layout)


def fake_entry(ids: list[int], *, rid: str = "r", version: str = "default", heads: int = 2) -> KvEntry:
    n = len(ids)
    keys = tuple(torch.full((heads, n, 16), float(i)) for i in range(2))
    values = tuple(torch.full((heads, n, 16), -float(i)) for i in range(2))
    return KvEntry(rid, np.asarray(ids, dtype=np.int32), keys, values, version)


def unpack_here(data: bytes, layout: CacheLayout, **overrides: object) -> KvEntry:
    kwargs: dict[str, object] = {"weight_version": "default", "vocab_size": VOCAB, "context_length": 2048}
    kwargs.update(overrides)
    return unpack(data, layout, **kwargs)  # type: ignore[arg-type]


# -- the layout ---------------------------------------------------------------------------------


def test_layout_reads_the_attention_shape_of_the_model(layout: CacheLayout) -> None:
    assert (layout.model_type, layout.num_layers, layout.num_kv_heads, layout.head_dim) == ("qwen3", 2, 2, 16)
    assert layout.dtype is torch.float32 and layout.bytes_per_token() == 2 * 2 * 2 * 16 * 4


def test_a_sliding_window_model_cannot_migrate() -> None:
    config = {**DEFAULT_MODEL_CONFIG, "model_type": "mistral", "sliding_window": 8}
    assert cache_layout(load_model(ModelSource(config=config)).model) is None


# -- packing ------------------------------------------------------------------------------------


def test_pack_then_unpack_gives_back_the_ids_and_every_tensor(
    loaded: LoadedModel, layout: CacheLayout
) -> None:
    ids = [7, 8, 9, 10, 11, 12]
    entry = real_entry(loaded, layout, ids, rid="req-1")
    data = pack(entry, layout)

    header = engine_api.read_kv_payload(data)  # no torch on this side
    assert header.meta.rid == "req-1" and header.meta.num_tokens == 6
    assert (header.meta.num_layers, header.meta.num_kv_heads, header.meta.dtype) == (2, 2, "float32")
    assert header.token_ids.tolist() == ids
    assert header.tensors["keys.1"].shape == [2, 6, 16] and header.tensors["keys.1"].dtype == "F32"
    assert KvPayload.from_bytes(data).token_ids.tolist() == ids

    back = unpack_here(data, layout)
    assert back.token_ids.tolist() == ids and back.rid == "req-1"
    for mine, theirs in zip((*entry.keys, *entry.values), (*back.keys, *back.values), strict=True):
        assert torch.equal(mine, theirs)
    # The payload is the raw tensors plus a header of a few hundred bytes.
    assert entry.nbytes < len(data) < entry.nbytes + 2048


def test_the_entry_of_a_cache_is_its_tensors_and_checks_coverage(
    loaded: LoadedModel, layout: CacheLayout
) -> None:
    cache, _ = prefill(loaded, [1, 2, 3, 4])
    entry = entry_from_cache(cache, [1, 2, 3, 4], rid="r", weight_version="v", layout=layout)
    assert torch.equal(entry.keys[0], cache.layers[0].keys[0])  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="does not cover every position"):
        entry_from_cache(cache, [1, 2, 3], rid="r", weight_version="v", layout=layout)


def _layout_of(**config: object) -> CacheLayout:
    found = cache_layout(load_model(ModelSource(config={**DEFAULT_MODEL_CONFIG, **config})).model)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("other", "words"),
    [
        ({"num_hidden_layers": 3}, "model"),
        ({"num_key_value_heads": 4}, "model"),
        ({"head_dim": 8}, "model"),
    ],
)
def test_unpack_refuses_a_payload_of_another_model(
    loaded: LoadedModel, layout: CacheLayout, other: dict[str, object], words: str
) -> None:
    data = pack(real_entry(loaded, layout, [1, 2, 3]), layout)
    with pytest.raises(PayloadIncompatible, match=words):
        unpack_here(data, _layout_of(**other))


def test_unpack_refuses_another_dtype(loaded: LoadedModel, layout: CacheLayout) -> None:
    entry = real_entry(loaded, layout, [1, 2, 3])
    half = KvEntry(
        entry.rid,
        entry.token_ids,
        tuple(t.half() for t in entry.keys),
        tuple(t.half() for t in entry.values),
        entry.weight_version,
    )
    data = pack(half, CacheLayout("qwen3", 2, 2, 16, torch.float16))
    with pytest.raises(PayloadIncompatible, match="float16"):
        unpack_here(data, layout)


def test_unpack_refuses_other_weights(loaded: LoadedModel, layout: CacheLayout) -> None:
    data = pack(real_entry(loaded, layout, [1, 2, 3]), layout)
    with pytest.raises(PayloadIncompatible, match="weight version"):
        unpack_here(data, layout, weight_version="v2")


def test_unpack_refuses_tensors_that_do_not_match_their_header(layout: CacheLayout) -> None:
    """Metadata that claims this model over tensors of another shape: refused from the header."""
    meta = engine_api.KvPayloadMeta(
        format=engine_api.KV_PAYLOAD_FORMAT,
        rid="r",
        weight_version="default",
        num_tokens=3,
        model_type="qwen3",
        num_layers=2,
        num_kv_heads=2,
        head_dim=16,
        dtype="float32",
    )
    tensors = {"token_ids": torch.tensor([1, 2, 3], dtype=torch.int32)}
    for index in range(2):
        tensors[f"keys.{index}"] = torch.zeros(2, 3, 8)  # head_dim 8, not 16
        tensors[f"values.{index}"] = torch.zeros(2, 3, 16)
    with pytest.raises(PayloadIncompatible, match=r"keys.0 is F32 \[2, 3, 8\]"):
        unpack_here(save(tensors, metadata=meta.to_strings()), layout)
    del tensors["values.1"]
    with pytest.raises(PayloadIncompatible, match="tensors are"):
        unpack_here(save(tensors, metadata=meta.to_strings()), layout)


def test_unpack_refuses_ids_outside_the_vocabulary_or_context(
    loaded: LoadedModel, layout: CacheLayout
) -> None:
    data = pack(real_entry(loaded, layout, [1, 2, 300]), layout)
    with pytest.raises(PayloadIncompatible, match="vocabulary"):
        unpack_here(data, layout, vocab_size=300)
    with pytest.raises(PayloadIncompatible, match="covers 3 tokens"):
        unpack_here(data, layout, context_length=3)


@pytest.mark.parametrize("cut", [0, 5, 100, -1])
def test_unpack_refuses_a_cut_payload(loaded: LoadedModel, layout: CacheLayout, cut: int) -> None:
    data = pack(real_entry(loaded, layout, [1, 2, 3]), layout)
    with pytest.raises(PayloadIncompatible):
        unpack_here(data[:cut], layout)


def test_a_safetensors_file_of_something_else_is_not_a_kv_payload() -> None:
    with pytest.raises(ValueError, match=r"not a gyre KV payload"):
        engine_api.read_kv_payload(save({"w": torch.zeros(2)}, metadata={"format": "pt"}))


# -- reuse --------------------------------------------------------------------------------------


def test_a_cache_built_from_an_entry_continues_like_a_full_prefill(
    loaded: LoadedModel, layout: CacheLayout
) -> None:
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    entry = real_entry(loaded, layout, ids)
    before = [t.clone() for t in (*entry.keys, *entry.values)]
    _, full_logits = prefill(loaded, [*ids, 13])
    cache = cache_from_entry(entry, len(ids), loaded.model.config)
    with torch.inference_mode():
        reused = loaded.model(input_ids=torch.tensor([[13]]), cache=cache, use_cache=True).logits[0, -1]
        # a second request from the same entry after the first one decoded into its copy
        cache_from_entry(entry, 5, loaded.model.config)
    torch.testing.assert_close(reused, full_logits, atol=1e-5, rtol=0)
    for old, new in zip(before, (*entry.keys, *entry.values), strict=True):
        assert torch.equal(old, new)  # decoding into the copy left the entry alone


# -- the stores ---------------------------------------------------------------------------------


def test_prefix_match_takes_the_longest_shared_prefix_and_leaves_the_last_token() -> None:
    store = PrefixCache(KvLimits(max_entries=8))
    store.put("short", fake_entry([1, 2, 3]))
    store.put("long", fake_entry([1, 2, 3, 4, 5, 6]))
    store.put("other", fake_entry([9, 9, 9, 9, 9, 9, 9]))

    found = store.match([1, 2, 3, 4, 5, 6, 7, 8], "default")
    assert found is not None and found[0].num_tokens == 6 and found[1] == 6
    found = store.match([1, 2, 3, 4, 5, 6], "default")  # the whole entry: its last token runs again
    assert found is not None and found[1] == 5
    found = store.match([1, 2, 3, 4, 0, 0], "default")  # diverges inside an entry: the shared part
    assert found is not None and found[1] == 4
    assert store.match([2, 1, 3, 4], "default") is None
    assert store.match([1], "default") is None
    assert store.match([1, 2, 3, 4, 5, 6, 7], "v2") is None  # KV of other weights is never reused


def test_prefix_cache_evicts_least_recently_used_within_its_bounds() -> None:
    per_entry = fake_entry([1, 2, 3]).nbytes
    store = PrefixCache(KvLimits(max_entries=2, max_bytes=10 * per_entry))
    store.put("a", fake_entry([1, 2, 3]))
    store.put("b", fake_entry([4, 5, 6]))
    assert store.match([1, 2, 3, 0], "default") is not None  # a is now the most recent
    store.put("c", fake_entry([7, 8, 9]))
    assert store.totals() == (2, 2 * per_entry)
    assert store.match([4, 5, 6, 0], "default") is None  # b went
    assert store.match([1, 2, 3, 0], "default") is not None

    by_bytes = PrefixCache(KvLimits(max_entries=10, max_bytes=2 * per_entry))
    for key in "xyz":
        by_bytes.put(key, fake_entry([1, 2, 3]))
    assert by_bytes.totals() == (2, 2 * per_entry)
    with pytest.raises(KvStoreFull, match="exceeds the import bound"):
        by_bytes.put("huge", fake_entry(list(range(10))))
    assert by_bytes.clear() == 2 and by_bytes.totals() == (0, 0)


def test_pins_are_refused_past_the_bound_and_freed_by_release() -> None:
    per_entry = fake_entry([1, 2]).nbytes
    pins = PinnedCaches(KvLimits(max_entries=2, max_bytes=3 * per_entry))
    pins.add(fake_entry([1, 2], rid="a"))
    pins.add(fake_entry([1, 2], rid="b"))
    with pytest.raises(KvStoreFull, match="bound is 2 caches"):
        pins.add(fake_entry([1, 2], rid="c"))
    assert pins.totals() == (2, 2 * per_entry)  # a refusal changes nothing
    pins.add(fake_entry([3, 4], rid="b"))  # the same rid again replaces its pin
    assert pins.get("b").token_ids.tolist() == [3, 4]

    assert pins.release("a").rid == "a" and pins.totals() == (1, per_entry)
    with pytest.raises(PinNotFound):
        pins.get("a")
    with pytest.raises(PinNotFound):
        pins.release("a")
    with pytest.raises(KvStoreFull, match="bytes"):
        pins.add(fake_entry(list(range(8)), rid="big"))


# -- the client's errors --------------------------------------------------------------------------


def _answering(status: int, body: object) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=msgspec.json.encode(body))

    return httpx.MockTransport(handler)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("code", "error"),
    [
        (engine_api.KV_NOT_FOUND, KvCacheNotFound),
        (engine_api.KV_CACHE_FULL, KvCacheFull),
        (engine_api.KV_INCOMPATIBLE, KvCacheIncompatible),
        (engine_api.KV_UNSUPPORTED, KvMigrationUnsupported),
    ],
)
async def test_client_turns_kv_codes_into_typed_errors(code: str, error: type[Exception]) -> None:
    body = {"error": {"message": f"refused: {code}", "code": code}}
    async with EngineClient(EngineClientConfig("http://e"), transport=_answering(409, body)) as client:
        with pytest.raises(error, match=f"refused: {code}"):
            await client.pin_and_abort("r")
        with pytest.raises(error):
            await client.import_kv(b"payload")


@pytest.mark.anyio
async def test_client_calls_an_engine_without_kv_endpoints_unsupported() -> None:
    """A real SGLang server answers 404 for /gyre/...: the proxy falls back to re-prefill."""
    transport = _answering(404, {"detail": "Not Found"})
    async with EngineClient(EngineClientConfig("http://e"), transport=transport) as client:
        with pytest.raises(KvMigrationUnsupported, match="no KV-migration endpoint"):
            await client.export_kv("r")
        with pytest.raises(KvMigrationUnsupported):
            await client.kv_status()
    plain = _answering(400, {"error": {"message": "invalid request body"}})
    async with EngineClient(EngineClientConfig("http://e"), transport=plain) as client:
        with pytest.raises(EngineBadRequest, match="invalid request body"):
            await client.release_kv("r")

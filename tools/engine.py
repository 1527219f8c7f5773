"""``gyre engine serve``: run gyre's reference engine (SGLang's native HTTP API) in the foreground."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gyre_tools.cli import add_env_argument

NO_CONTEXT_CAP = 1 << 30


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = subparsers.add_parser("engine", help="gyre's reference inference engine")
    commands = engine.add_subparsers(dest="engine_command", metavar="ENGINE_COMMAND")
    commands.required = True
    serve = commands.add_parser("serve", help="serve a small causal LM with SGLang's native HTTP API")
    add_env_argument(serve, "--host", "GYRE_ENGINE_HOST", default="127.0.0.1", help="address to bind")
    add_env_argument(serve, "--port", "GYRE_ENGINE_PORT", default="30000", type=int, help="port to bind")
    add_env_argument(
        serve,
        "--advertise-host",
        "GYRE_ENGINE_ADVERTISE_HOST",
        help="the address other machines reach this one at: where its Mooncake Transfer Engine says "
        "its exposed KV caches are (default: --host, or 127.0.0.1 when --host is a wildcard)",
    )
    source = serve.add_mutually_exclusive_group()
    add_env_argument(
        source,  # type: ignore[arg-type]
        "--model-config",
        "GYRE_ENGINE_MODEL_CONFIG",
        help="Hugging Face config as JSON (with model_type); default a tiny Qwen3",
    )
    add_env_argument(
        source,  # type: ignore[arg-type]
        "--model-dir",
        "GYRE_ENGINE_MODEL_DIR",
        help="folder written by save_pretrained (a tokenizer.json there is used too)",
    )
    source.add_argument(
        "--model",
        dest="model_dir",
        default=argparse.SUPPRESS,
        help="the same as --model-dir: a checkpoint folder, served with its own tokenizer.json and EOS",
    )
    add_env_argument(
        serve, "--seed", "GYRE_ENGINE_SEED", default="0", type=int, help="weights and sampling seed"
    )
    add_env_argument(
        serve,
        "--tokenizer",
        "GYRE_ENGINE_TOKENIZER",
        default="auto",
        help="qwen: the Qwen3.5/3.6 vocabulary the proxy uses (and a tiny model over it); byte; auto: the "
        "model dir's tokenizer.json, else qwen for the built-in model (what gyre proxy serve sends), else byte",
    )
    add_env_argument(
        serve,
        "--max-context",
        "GYRE_ENGINE_MAX_CONTEXT",
        default="0",
        type=int,
        help="context length in tokens; 0: the model's own limit (65,536 for the built-in model)",
    )
    add_env_argument(
        serve,
        "--device",
        "GYRE_ENGINE_DEVICE",
        default="cpu",
        help="where the weights and KV cache live: cpu, cuda or cuda:N (sampling stays on the CPU)",
    )
    add_env_argument(
        serve,
        "--weight-version",
        "GYRE_ENGINE_WEIGHT_VERSION",
        default="default",
        help="initial weight version",
    )
    add_env_argument(
        serve, "--script", "GYRE_ENGINE_SCRIPT", help="scripted-policy JSON file to force-decode"
    )
    add_env_argument(
        serve,
        "--return-original-logprob",
        "GYRE_ENGINE_RETURN_ORIGINAL_LOGPROB",
        default="0",
        type=int,
        help="1: report logprobs of the raw logits even when temperature != 1",
    )
    add_env_argument(
        serve,
        "--incremental-streaming-output",
        "GYRE_ENGINE_INCREMENTAL_STREAMING_OUTPUT",
        default="0",
        type=int,
        help="1: stream deltas instead of SGLang's default cumulative chunks",
    )
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from gyre_proxy.engines import ReferenceEngineError, reachable_host
    from gyre_proxy.engines.refengine import ModelSource, MooncakeConfig, ReferenceEngineConfig, serve

    try:
        config_json = json.loads(args.model_config) if args.model_config else None
    except json.JSONDecodeError as exc:
        print(f"gyre engine serve: --model-config is not JSON: {exc}")
        return 2
    if args.max_context < 0:
        print("gyre engine serve: --max-context must be 0 (the model's limit) or more")
        return 2
    tokenizer = args.tokenizer
    if tokenizer == "auto" and not args.model_dir and config_json is None:
        # With its defaults the engine must take what `gyre proxy serve` sends: Qwen token ids.
        tokenizer = "qwen"
    config = ReferenceEngineConfig(
        source=ModelSource(
            config=config_json,
            model_dir=Path(args.model_dir) if args.model_dir else None,
            seed=args.seed,
            tokenizer=tokenizer,
            device=args.device,
        ),
        # 0: as long as the model's positions reach (the engine takes the smaller of the two).
        max_context=args.max_context or NO_CONTEXT_CAP,
        seed=args.seed,
        weight_version=args.weight_version,
        script=Path(args.script) if args.script else None,
        return_original_logprob=bool(args.return_original_logprob),
        incremental_streaming_output=bool(args.incremental_streaming_output),
        mooncake=MooncakeConfig(host=reachable_host(args.host, args.advertise_host)),
    )
    try:
        serve(config, host=args.host, port=args.port)
    except ReferenceEngineError as exc:
        print(f"gyre engine serve: {exc}")
        return 1
    return 0

"""The run configuration refuses a micro-step budget that a whole context would not fit, an
unknown harness, and a context too small for the harness's first request."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre_tools.run_config import DEMO, ConfigFileError, judge_engine, parse_config, to_toml


def test_the_demo_config_round_trips() -> None:
    assert parse_config(to_toml(DEMO)) == DEMO


def test_a_micro_step_smaller_than_the_context_is_refused() -> None:
    text = "[model]\nmax_context = 8192\n[train]\nmicro_step_tokens = 4096\n"
    with pytest.raises(
        ConfigFileError, match=r"micro_step_tokens \(4096\) must be at least model.max_context \(8192\)"
    ):
        parse_config(text, where="run.toml")
    config = parse_config("[model]\nmax_context = 8192\n[train]\nmicro_step_tokens = 8192\n")
    assert (config.model.max_context, config.train.micro_step_tokens) == (8192, 8192)


@pytest.mark.parametrize("policy", ["elastic", "colocate"])
def test_a_policy_that_moves_cells_reaches_the_scheduler(policy: str) -> None:
    config = parse_config(f'policy = "{policy}"\ncells = 3\ntau_s = 0.5\n', where="run.toml")
    sched = config.sched()
    assert (sched.policy.value, sched.cells, sched.tau_s) == (policy, 3, 0.5)
    with pytest.raises(ConfigFileError, match="policy must be one of"):
        parse_config('policy = "sideways"\n')


def test_a_bad_policy_flag_is_refused_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    from gyre_tools.cli import main

    config = tmp_path / "run.toml"
    config.write_text(to_toml(DEMO))
    assert main(["run", "--config", str(config), "--policy", "sideways"]) == 2  # before anything starts
    assert parse_config(config.read_text()).policy == "async"


def test_the_policy_flag_is_checked_as_the_run_will_have_it() -> None:
    # Three moving cells beside a pool of 4 hold a batch of 8; as async (the pool alone) they
    # would not: the checks must see the policy given on the command line.
    text = "B = 4\nN = 2\ncells = 3\nrollout_engines = 1\nengine_capacity = 4\n"
    from gyre_sched import CapacityBelowBatchError

    with pytest.raises(CapacityBelowBatchError, match="below one batch"):
        parse_config(text)
    assert parse_config(text, policy="elastic").policy == "elastic"


@pytest.mark.parametrize(("harness", "first"), [("claude-code", 12_000), ("codex", 9_000)])
def test_a_context_too_small_for_the_harnesss_first_request_is_refused(harness: str, first: int) -> None:
    with pytest.raises(
        ConfigFileError,
        match=rf"model.max_context \(4096\) is too small for harness '{harness}': its first request takes about "
        rf"{first} tokens, so it needs at least {first + 160} \(that plus model.max_tokens = 160\)",
    ):
        parse_config(f'harness = "{harness}"\n', where="run.toml")
    text = (
        f'harness = "{harness}"\n[model]\nmax_context = {first + 160}\n[train]\nmicro_step_tokens = 32768\n'
    )
    assert parse_config(text).model.max_context == first + 160
    assert parse_config('harness = "builtin"\n').model.max_context == 4096  # the demo's context holds it


def test_an_unknown_harness_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        ConfigFileError, match=r"run.toml: harness: unknown harness 'vim'; known: builtin, claude-code"
    ):
        parse_config('harness = "vim"\n', where="run.toml")


HARBOR = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


def test_a_task_source_and_a_sandbox_are_read_and_checked() -> None:
    config = parse_config(
        f'[tasks]\nsource = "{HARBOR}"\nheldout_ids = ["fix-add"]\n[sandbox]\nkind = "bwrap"\n'
    )
    assert (config.tasks.spec, config.sandbox.kind, config.tasks.heldout_ids) == (
        str(HARBOR),
        "bwrap",
        ["fix-add"],
    )
    assert parse_config(to_toml(config)) == config
    assert DEMO.tasks.spec == "builtin:copy-line" and DEMO.sandbox.kind == "local"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[sandbox]\nkind = "chroot"\n',
            r"sandbox.kind must be one of \['local', 'bwrap', 'podman', 'docker'\], got 'chroot'",
        ),
        (f'[tasks]\nsource = "{HARBOR}"\n', "holds Harbor tasks, whose tests use absolute paths"),
        (
            '[tasks]\nsource = "/no/such/tasks"\n[sandbox]\nkind = "bwrap"\n',
            "tasks.source: .*/no/such/tasks: no such folder or file",
        ),
        ('[tasks]\nheldout_ids = ["x"]\n', "heldout_ids applies to a folder or .jsonl source only"),
        (
            '[eval]\njudge = "engine:pool-2"\n',
            r"eval.judge = 'engine:pool-2': the run has no engine 'pool-2' \(its engines: pool-0, pool-1;",
        ),
        ('[eval]\njudge = "engine:"\n', "the run has no engine ''"),
        (
            '[eval]\njudge = "ftp://judge"\n',
            r"eval.judge must be \"\", \"policy\", \"engine:NAME\" or an http\(s\) URL",
        ),
        ('[eval]\njudge = "http://127.0.0.1:9/v1"\n', "eval.judge_model: a URL judge needs the model name"),
    ],
    ids=[
        "unknown-sandbox",
        "harbor-under-local",
        "missing-source",
        "heldout-ids-of-a-family",
        "judge-engine",
        "judge-engine-unnamed",
        "judge-scheme",
        "judge-model",
    ],
)
def test_bad_task_sandbox_and_judge_settings_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigFileError, match=message) as caught:
        parse_config(text, where="run.toml")
    assert str(caught.value).startswith("run.toml: ") and "\n" not in str(caught.value)


def test_a_judge_on_the_runs_policy_or_one_of_its_engines_is_read_and_named_as_the_log_names_it() -> None:
    externals = 'run_id = "r"\nexternal_engines = ["big=http://10.0.0.7:30000"]\n'
    assert parse_config('[eval]\njudge = "policy"\n').eval.judge == "policy"
    config = parse_config(externals + '[eval]\njudge = "engine:big"\n')
    assert judge_engine(config, "big") == "r:ext-big"  # as gyre run registers an external engine
    assert judge_engine(config, "pool-1") == "r:pool-1"  # as node agents name the pool's engines
    assert judge_engine(config, "pool-2") is None and judge_engine(config, "small") is None
    assert parse_config(externals + '[eval]\njudge = "engine:pool-0"\n').eval.judge == "engine:pool-0"


def test_the_weight_transport_is_read_checked_and_spelled_as_the_cells_spell_it() -> None:
    from gyre_tools.run_config import WEIGHT_TRANSPORTS
    from gyre_train.cells import WEIGHT_TRANSPORTS as CELL_TRANSPORTS

    assert WEIGHT_TRANSPORTS == CELL_TRANSPORTS
    assert parse_config('[train]\nweight_transport = "mooncake"\n').train.weight_transport == "mooncake"
    assert DEMO.train.weight_transport == "torch"
    with pytest.raises(
        ConfigFileError, match=r"train.weight_transport must be one of \['torch', 'mooncake'\], got 'rdma'"
    ) as caught:
        parse_config('[train]\nweight_transport = "rdma"\n', where="run.toml")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "train",
    ['shard = "fsdp"\nshard_ranks = 2', 'backend = "megatron"\ntp = 2'],
    ids=["fsdp", "megatron"],
)
def test_mooncake_weights_are_refused_for_cells_of_several_processes(train: str) -> None:
    with pytest.raises(
        ConfigFileError,
        match=r'weight_transport = "mooncake" pulls one flat snapshot per cell; a cell of 2 processes',
    ):
        parse_config(f'[train]\nweight_transport = "mooncake"\n{train}\n', where="run.toml")
    assert parse_config(f"[train]\n{train}\n").train.weight_transport == "torch"

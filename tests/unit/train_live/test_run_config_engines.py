"""The run config's engine keys: `engine`, `external_engines` (counted in C_s) and
`train.publish`, each refused with a message that names the key and what to do."""

from __future__ import annotations

import pytest

from gyre_tools.run_config import (
    ConfigFileError,
    ExternalEngine,
    check_environment,
    parse_config,
    to_toml,
)


def test_the_defaults_are_the_reference_engine_and_disk() -> None:
    config = parse_config("")
    assert (config.engine, config.external_engines, config.train.publish) == ("reference", [], "disk")


def test_external_engines_take_the_engine_capacity_or_their_own_and_count_in_c_s() -> None:
    text = (
        'engine = "sglang"\nrollout_engines = 1\nengine_capacity = 4\nB = 2\nN = 2\n'
        'external_engines = ["a=http://127.0.0.1:30000", "b=http://127.0.0.1:30001/@6"]\n'
    )
    config = parse_config(text)
    assert config.externals == (
        ExternalEngine("a", "http://127.0.0.1:30000", 4),
        ExternalEngine("b", "http://127.0.0.1:30001", 6),
    )
    assert config.pool_capacity == 4 + 4 + 6
    assert config.sched().pool_capacity == 14
    assert parse_config(to_toml(config)) == config  # recorded in the log and read back


def test_external_engines_alone_make_a_pool() -> None:
    config = parse_config(
        'rollout_engines = 0\nB = 2\nN = 2\nexternal_engines = ["x=http://127.0.0.1:1@4"]\n'
    )
    assert (config.rollout_engines, config.pool_capacity) == (0, 4)
    with pytest.raises(
        ConfigFileError, match="rollout_engines = 0 leaves the async policy no rollout engine"
    ):
        parse_config("rollout_engines = 0\n")


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("no-equals-sign", "NAME must be"),
        ("a b=http://127.0.0.1:1", "NAME must be"),
        ("a=127.0.0.1:30000", "URL must be"),
        ("a=http://127.0.0.1:1@0", "CAP must be"),
        ("a=http://127.0.0.1:1@many", "CAP must be"),
    ],
)
def test_a_bad_external_engine_is_refused_naming_the_entry_and_the_form(entry: str, why: str) -> None:
    with pytest.raises(ConfigFileError, match=rf"external_engines entry '{entry}': {why}.*NAME=URL@CAP"):
        parse_config(f'external_engines = ["{entry}"]\n')


def test_names_must_be_unique() -> None:
    with pytest.raises(ConfigFileError, match="names must be unique"):
        parse_config('external_engines = ["a=http://127.0.0.1:1", "a=http://127.0.0.1:2"]\n')


def test_unknown_engine_kinds_and_methods_are_refused() -> None:
    with pytest.raises(ConfigFileError, match=r"engine must be one of \['reference', 'sglang'\], got 'vllm'"):
        parse_config('engine = "vllm"\n')
    with pytest.raises(ConfigFileError, match=r"train.publish must be one of .*got 'nccl'"):
        parse_config('[train]\npublish = "nccl"\n')


@pytest.mark.parametrize(
    ("method", "why"),
    [("tensor", "reaches only engines on this machine"), ("distributed", "cannot join: use")],
)
def test_a_method_an_engine_on_another_machine_cannot_take_is_refused(method: str, why: str) -> None:
    far = f'external_engines = ["far=http://10.1.2.3:30000"]\n[train]\npublish = "{method}"\n'
    with pytest.raises(ConfigFileError, match=f"external engine far.*{why}|{why}.*far"):
        parse_config(far)
    near = f'external_engines = ["near=http://127.0.0.1:30000"]\n[train]\npublish = "{method}"\n'
    assert parse_config(near).train.publish == method
    assert parse_config(far.replace(method, "disk")).train.publish == "disk"


def test_sglang_engines_need_sglangs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_SGLANG_HOME", "/nonexistent/gyre-sglang")  # never built there
    with pytest.raises(
        ConfigFileError, match=r'engine = "sglang" needs SGLang: .*not built.*sglang_setup.sh build'
    ):
        check_environment(parse_config('engine = "sglang"\n'))
    check_environment(parse_config(""))  # the reference engine needs nothing
    # Only external engines: nothing is started here, so nothing is needed.
    check_environment(
        parse_config(
            'engine = "sglang"\nrollout_engines = 0\nexternal_engines = ["a=http://127.0.0.1:1@16"]\n'
        )
    )

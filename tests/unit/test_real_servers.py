"""A harness that cannot be installed fails its test unless it is skipped on request
(``tests/real_servers.py``), so CI cannot go green without the real-harness tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.real_servers import harness_binary

Fail = pytest.fail.Exception
Skip = pytest.skip.Exception


@pytest.fixture
def broken_installer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The shell running the suite may itself opt out (CI without npm); these tests set their own.
    for name in ("GYRE_TEST_SKIP_CODEX", "GYRE_TEST_SKIP_HARNESSES", "GYRE_TEST_CODEX_ERROR"):
        monkeypatch.delenv(name, raising=False)
    installer = tmp_path / "install_codex.sh"
    installer.write_text('echo "npm is not installed" >&2\nexit 3\n')
    return installer


def outcome(installer: Path) -> BaseException:
    """The fail or skip that ``harness_binary`` raises, caught here so that a skip where a
    failure is expected turns the test red instead of skipping it."""
    try:
        harness_binary("codex", installer)
    except (Fail, Skip) as exc:
        return exc
    raise AssertionError("harness_binary returned although the installer failed")


def test_an_installed_harness_is_the_last_line_the_installer_prints(tmp_path: Path) -> None:
    installer = tmp_path / "install_codex.sh"
    installer.write_text("echo installing\necho /opt/codex/bin/codex\n")
    assert harness_binary("codex", installer) == "/opt/codex/bin/codex"


def test_a_harness_that_cannot_be_installed_fails_with_the_reason(broken_installer: Path) -> None:
    raised = outcome(broken_installer)
    assert isinstance(raised, Fail)
    assert re.search(r"CODEX UNAVAILABLE .*npm is not installed", str(raised))


def test_the_setup_error_of_run_tests_is_the_reason(
    broken_installer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_TEST_CODEX_ERROR", "npm registry timed out")
    raised = outcome(broken_installer)
    assert isinstance(raised, Fail)
    assert "could not set it up: npm registry timed out" in str(raised)


@pytest.mark.parametrize("opt_out", ["GYRE_TEST_SKIP_CODEX", "GYRE_TEST_SKIP_HARNESSES"])
def test_an_explicit_opt_out_skips_and_says_so(
    broken_installer: Path, monkeypatch: pytest.MonkeyPatch, opt_out: str
) -> None:
    monkeypatch.setenv(opt_out, "1")
    raised = outcome(broken_installer)
    assert isinstance(raised, Skip)
    assert f"CODEX SKIPPED ON REQUEST ({opt_out}=1)" in str(raised)


def test_another_harness_s_opt_out_does_not_skip(
    broken_installer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_TEST_SKIP_CLAUDE_CODE", "1")
    assert isinstance(outcome(broken_installer), Fail)


def test_a_missing_package_fails_unless_skipped_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from tests.real_servers import megatron_missing, require

    monkeypatch.delenv("GYRE_TEST_SKIP_MEGATRON", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("megatron") else real_find_spec(name, *a),
    )
    why = megatron_missing()
    assert why is not None and "MEGATRON-CORE NOT INSTALLED" in why
    with pytest.raises(Fail, match=r"MEGATRON UNAVAILABLE .*GYRE_TEST_SKIP_MEGATRON=1"):
        require("megatron", why)
    monkeypatch.setenv("GYRE_TEST_SKIP_MEGATRON", "1")
    with pytest.raises(Skip, match="SKIPPED ON REQUEST"):
        require("megatron", why)
    require("megatron", None)  # present: goes on

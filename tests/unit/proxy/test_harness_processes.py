"""Starting harness processes: a Python entry forks from a server that imported it and the
modules its spec preloads, and behaves as the program would (cwd, environment, stdin, output,
exit status)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ENTRY = textwrap.dedent(
    """
    import json, os, sys

    def main(args):
        import gyre_probe_heavy  # lazily, as the built-in agent imports its SDK
        print(json.dumps({
            "args": args,
            "cwd": os.getcwd(),
            "env": os.environ.get("PROBE_VALUE"),
            "home": os.environ.get("HOME"),
            "stdin": sys.stdin.read(),
            "heavy_imported_here": gyre_probe_heavy.IMPORTED_IN == os.getpid(),
        }))
        return 7

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)
HEAVY = "import os\nIMPORTED_IN = os.getpid()\n"


DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from gyre_proxy.harness import LaunchSpec
    from gyre_proxy.launch.processes import Starter

    def main():
        tmp, fork = Path(sys.argv[1]), sys.argv[2] == "fork"
        spec = LaunchSpec(
            (sys.executable, "-m", "gyre_probe_entry", "--flag", "x"),
            {"PROBE_VALUE": "v"},
            stdin="the task",
            entry=("gyre_probe_entry", "main"),
            preload=("gyre_probe_heavy",),
        )
        starter = Starter(fork_entries=fork)
        for name in ("first", "second"):
            cwd = tmp / name
            cwd.mkdir()
            env = {"PROBE_VALUE": "v", "HOME": str(cwd), "PYTHONPATH": str(tmp / "modules")}
            process = starter.start(spec, cwd=cwd, env=env, log=tmp / f"{name}.log")
            print(json.dumps({"name": name, "code": process.wait(60)}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "gyre_probe_entry.py").write_text(ENTRY)
    (folder / "gyre_probe_heavy.py").write_text(HEAVY)
    (tmp_path / "driver.py").write_text(DRIVER)
    return tmp_path


def _starts(tmp: Path, mode: str) -> list[dict[str, object]]:
    """Two executions started by one Starter in a fresh interpreter (the fork server is one per
    process, so a test must not share it); what each harness process saw."""
    env = {**os.environ, "PYTHONPATH": str(tmp / "modules")}  # the fork server imports from here
    done = subprocess.run(
        [sys.executable, str(tmp / "driver.py"), str(tmp), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    codes = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [c["code"] for c in codes] == [7, 7]
    seen = []
    for name in ("first", "second"):
        lines = [line for line in (tmp / f"{name}.log").read_text().splitlines() if line.startswith("{")]
        assert lines, (tmp / f"{name}.log").read_text()
        seen.append({"name": name, **json.loads(lines[-1])})
    return seen


def _check_program(seen: dict[str, object], tmp: Path) -> None:
    assert seen["args"] == ["--flag", "x"]
    assert seen["cwd"] == str((tmp / str(seen["name"])).resolve())
    assert seen["env"] == "v" and seen["home"] == str(tmp / str(seen["name"]))
    assert seen["stdin"] == "the task"


def test_a_program_run_sees_the_spec_and_imports_its_own_modules(probe: Path) -> None:
    for seen in _starts(probe, "program"):
        _check_program(seen, probe)
        assert seen["heavy_imported_here"] is True


@pytest.mark.skipif(sys.platform != "linux", reason="the fork server is a Linux start method here")
def test_a_forked_entry_finds_its_preloaded_modules_already_imported(probe: Path) -> None:
    for seen in _starts(probe, "fork"):
        _check_program(seen, probe)
        # Imported once in the fork server, not again in each harness process.
        assert seen["heavy_imported_here"] is False


def test_the_builtin_harness_preloads_its_sdk() -> None:
    from gyre_proxy.harness.builtin import BuiltinHarness
    from gyre_proxy.harness.plugin import Launch

    launch = Launch(Path("/w"), Path("/h"), "the task", "http://proxy", "key", "model")
    spec = BuiltinHarness().launch_spec(launch)
    assert spec.entry == ("gyre_proxy.harness.agent", "main")
    assert "anthropic" in spec.preload

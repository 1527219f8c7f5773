"""The container sandboxes without an engine: the ``podman run`` arguments and the Docker API's
create arguments built from binds, limits and environment, the FROM rewrite and the content hash
of a build, the choice of a task's image, and the one-line errors when an engine is missing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

import pytest

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox import Bind, Limits, RunResult, sandbox_for
from gyre_train.sandbox.docker import create_kwargs
from gyre_train.sandbox.images import (
    BASE_IMAGE,
    BUILT_DOCKERFILE,
    ContainerSandbox,
    check_binds,
    container_name,
    context_hash,
    rewrite_from,
)
from gyre_train.sandbox.podman import run_args

LIMITS = Limits(memory_mb=512, cpu_s=30, processes=64, file_size_mb=8)


def _binds(tmp_path: Path) -> list[Bind]:
    return [Bind(tmp_path / "ws", "/app", writable=True), Bind(tmp_path / "tests", "/tests")]


def _after(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_podman_run_arguments(tmp_path: Path) -> None:
    args = run_args(
        "localhost/img:1",
        ["python3", "-c", "print(1)"],
        name="gyre-x",
        workdir="/app",
        binds=_binds(tmp_path),
        env={"TASK_VAR": "1"},
        limits=LIMITS,
    )
    assert args[:3] == ["run", "--rm", "--name"] and _after(args, "--name") == ["gyre-x"]
    assert _after(args, "--network") == ["none"] and "--unsetenv-all" in args
    assert _after(args, "-w") == ["/app"] and _after(args, "--entrypoint") == [""]
    assert _after(args, "-v") == [f"{tmp_path / 'ws'}:/app", f"{tmp_path / 'tests'}:/tests:ro"]
    assert _after(args, "--memory") == ["512m"] and _after(args, "--memory-swap") == ["512m"]
    assert _after(args, "--pids-limit") == ["64"]
    assert "--ulimit" not in args  # podman would add open-file and process rlimits runc cannot set
    assert sorted(_after(args, "--env")) == [
        "HOME=/app",
        "LANG=C.UTF-8",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "TASK_VAR=1",
        "TMPDIR=/tmp",
    ]
    image_at = args.index("localhost/img:1")
    assert args[image_at + 1 :] == [
        "prlimit",
        "--cpu=30",
        f"--fsize={8 * 2**20}",
        "--",
        "python3",
        "-c",
        "print(1)",
    ]


def test_podman_run_arguments_without_limits_run_the_command_itself() -> None:
    args = run_args("img", ["true"], name="n", workdir="/w")
    assert args[-2:] == ["img", "true"]
    assert not {"--memory", "--pids-limit", "-v"} & set(args)
    with pytest.raises(SandboxError, match="command: empty"):
        run_args("img", [], name="n", workdir="/w")
    with pytest.raises(SandboxError, match="gyre's own settings"):
        run_args("img", ["env"], name="n", workdir="/w", env={"GYRE_RUN": "x"})


def test_docker_create_arguments(tmp_path: Path) -> None:
    kwargs = create_kwargs(
        "img", ["sh", "-c", "true"], name="gyre-y", workdir="/app", binds=_binds(tmp_path), limits=LIMITS
    )
    assert kwargs["network_mode"] == "none" and kwargs["name"] == "gyre-y" and kwargs["entrypoint"] == []
    assert (kwargs["mem_limit"], kwargs["memswap_limit"], kwargs["pids_limit"]) == ("512m", "512m", 64)
    mounts = [(m["Source"], m["Target"], m["ReadOnly"]) for m in kwargs["mounts"]]
    assert mounts == [(str(tmp_path / "ws"), "/app", False), (str(tmp_path / "tests"), "/tests", True)]
    assert kwargs["environment"]["HOME"] == "/app" and set(kwargs["environment"]) == {
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
    }
    assert kwargs["command"][:4] == ["prlimit", "--cpu=30", f"--fsize={8 * 2**20}", "--"]


def test_binds_a_volume_argument_cannot_carry_are_refused(tmp_path: Path) -> None:
    odd = tmp_path / "a:b"
    odd.mkdir()
    with pytest.raises(SandboxError, match="may not hold"):
        check_binds("/app", [Bind(odd, "/x")])
    with pytest.raises(SandboxError, match="does not exist"):
        check_binds("/app", [Bind(tmp_path / "missing", "/x")])
    with pytest.raises(SandboxError, match="absolute path"):
        check_binds("app", [])
    check_binds("/app", [Bind(tmp_path, "/x")])


def test_container_names_are_safe_and_one_off_names_unique() -> None:
    assert container_name("exec 7/a:b") == "gyre-exec-7-a-b"
    assert container_name() != container_name()


def test_a_missing_from_image_becomes_the_base_with_a_note() -> None:
    text = (
        "# build\nFROM python:3.11-slim AS build\nRUN true\n"
        "FROM --platform=linux/amd64 localhost/here:1\nCOPY --from=build /x /x\n"
        "FROM build\nFROM scratch\r\n"
    )
    rewritten = rewrite_from(text, lambda image: image == "localhost/here:1")
    assert rewritten.text.splitlines(keepends=True) == [
        "# build\n",
        f"FROM {BASE_IMAGE} AS build\n",
        "RUN true\n",
        "FROM --platform=linux/amd64 localhost/here:1\n",
        "COPY --from=build /x /x\n",
        "FROM build\n",
        "FROM scratch\r\n",
    ]
    assert rewritten.bases == (BASE_IMAGE, "localhost/here:1")
    assert len(rewritten.notes) == 1 and "python:3.11-slim is not present locally" in rewritten.notes[0]
    assert rewrite_from("FROM img\n", lambda _: True).notes == ()


def test_the_content_hash_follows_the_dockerfile_the_context_and_the_base(tmp_path: Path) -> None:
    (tmp_path / "calc.py").write_text("x = 1\n")
    first = context_hash("FROM a\n", tmp_path, ["id1"])
    assert context_hash("FROM a\n", tmp_path, ["id1"]) == first
    assert context_hash("FROM b\n", tmp_path, ["id1"]) != first
    assert context_hash("FROM a\n", tmp_path, ["id2"]) != first
    (tmp_path / "calc.py").write_text("x = 2\n")
    assert context_hash("FROM a\n", tmp_path, ["id1"]) != first
    (tmp_path / "calc.py").write_text("x = 1\n")
    (tmp_path / "calc.py").chmod(0o755)
    assert context_hash("FROM a\n", tmp_path, ["id1"]) != first


class _Engine(ContainerSandbox):
    """An engine held in memory: images by name, builds recorded."""

    kind = "podman"

    def __init__(self, images: set[str]) -> None:
        self.image = BASE_IMAGE
        self.images = images
        self.built: list[tuple[str, str]] = []

    def with_image(self, image: str) -> Self:
        clone = _Engine(self.images)
        clone.image = image
        return clone  # type: ignore[return-value]

    def has_image(self, image: str) -> bool:
        return image in self.images

    def image_id(self, image: str) -> str:
        if image not in self.images:
            raise SandboxError(f"image {image} is not present")
        return f"id-{image}"

    def build(self, context: Path, dockerfile: str, tag: str) -> None:
        self.built.append(((context / dockerfile).read_text(), tag))
        self.images.add(tag)

    def run(
        self,
        command: Sequence[str],
        *,
        workdir: str,
        binds: Sequence[Bind] = (),
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        limits: Limits = Limits(),  # noqa: B008
    ) -> RunResult:
        raise AssertionError("choosing an image runs nothing")


def test_a_dockerfile_is_built_once_from_the_base(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = _Engine({BASE_IMAGE})
    dockerfile = tmp_path / "environment" / "Dockerfile"
    dockerfile.parent.mkdir()
    dockerfile.write_text("FROM debian:bookworm-slim\nRUN touch /x\n")
    (dockerfile.parent / "data.bin").write_bytes(b"\0\1")
    tag = engine.image_for(dockerfile, "debian:bookworm-slim")
    assert tag.startswith("localhost/gyre-task:")
    assert engine.built == [(f"FROM {BASE_IMAGE}\nRUN touch /x\n", tag)]
    assert "debian:bookworm-slim is not present locally" in caplog.text
    assert engine.image_for(dockerfile, None) == tag and len(engine.built) == 1
    (dockerfile.parent / "data.bin").write_bytes(b"\0\2")
    assert engine.image_for(dockerfile, None) != tag and len(engine.built) == 2
    assert BUILT_DOCKERFILE not in [p.name for p in dockerfile.parent.iterdir()]  # built from a copy


def test_an_image_without_a_dockerfile() -> None:
    engine = _Engine({BASE_IMAGE, "localhost/task:1"})
    assert engine.image_for(None, None) == BASE_IMAGE
    assert engine.image_for(None, "localhost/task:1") == "localhost/task:1"
    with pytest.raises(SandboxError, match=r"not present locally.*podman load"):
        engine.image_for(None, "python:3.11")
    with pytest.raises(SandboxError, match="not present"):
        _Engine(set()).image_for(None, None)


def test_a_missing_engine_says_what_to_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("gyre_train.sandbox.podman.shutil.which", lambda name: None)
    with pytest.raises(SandboxError, match=r"PODMAN NOT INSTALLED: run tools/podman_setup\.sh"):
        sandbox_for("podman")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(SandboxError) as caught:
        sandbox_for("docker")
    message = str(caught.value)
    assert "\n" not in message and f"{tmp_path}/none.sock" in message and "tools/podman_setup.sh" in message

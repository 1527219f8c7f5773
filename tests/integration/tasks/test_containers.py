"""The container sandboxes against a real rootful podman: ``podman`` through its CLI, ``docker``
through the Docker Engine API of podman's own service (started here, on a socket of its own).
One suite runs against both: exit code, output, an environment built from nothing, read-only
and writable binds, no network, limits (processes, memory, file size, CPU time), a timeout that
removes the container, a task image built from a Dockerfile with a RUN line, Harbor's contract
on the fixture tasks, and prepared long-running containers removed by their cleanup.

They fail when podman or its base image is missing (``tools/podman_setup.sh`` sets both up);
``GYRE_TEST_SKIP_PODMAN=1`` skips them instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox import Bind, BwrapSandbox, Limits, Sandbox
from gyre_train.sandbox.images import BASE_IMAGE, ContainerSandbox
from gyre_train.sandbox.podman import GLOBAL_FLAGS, PodmanSandbox, podman_env, podman_missing
from gyre_train.sandbox.users import CONTAINER_IDS, CONTAINER_ROOT
from gyre_train.tasks import Verdict, check_task, open_source, refusal
from tests.real_servers import require

HARBOR = Path(__file__).resolve().parents[2] / "fixtures" / "harbor"
KINDS = ["podman", "docker"]


def _podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *GLOBAL_FLAGS, *args], env=podman_env(), capture_output=True, text=True, timeout=120
    )


def _gyre_containers() -> list[str]:
    done = _podman("ps", "--all", "--filter", "name=^gyre-", "--format", "{{.Names}}")
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture(scope="module")
def podman() -> PodmanSandbox:
    missing = podman_missing()
    if missing is None and _podman("image", "exists", BASE_IMAGE).returncode != 0:
        missing = f"the base image {BASE_IMAGE} is missing: run tools/podman_setup.sh"
    require("podman", missing)
    return PodmanSandbox()


@pytest.fixture(scope="module")
def docker_url(podman: PodmanSandbox) -> Iterator[str]:
    """podman's Docker-compatible service on a socket of its own, for this module only."""
    folder = Path(tempfile.mkdtemp(prefix="gyre-podman-service-"))
    url = f"unix://{folder}/podman.sock"
    service = subprocess.Popen(
        ["podman", *GLOBAL_FLAGS, "system", "service", "--time=0", url],
        env=podman_env(),
        cwd=folder,  # conmon leaves a file "oom" in its working folder when a container hits its memory
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        for _ in range(300):
            if (folder / "podman.sock").exists() or service.poll() is not None:
                break
            time.sleep(0.1)
        if service.poll() is not None:
            pytest.fail(f"podman system service exited {service.returncode}: {service.stderr.read()!r}")  # type: ignore[union-attr]
        yield url
    finally:
        service.terminate()
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        service.stderr.close()  # type: ignore[union-attr]
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module", params=KINDS)
def box(request: pytest.FixtureRequest, podman: PodmanSandbox) -> Iterator[ContainerSandbox]:
    if request.param == "podman":
        yield podman
        return
    from gyre_train.sandbox.docker import DockerSandbox

    with DockerSandbox(base_url=request.getfixturevalue("docker_url")) as docker:
        yield docker


@pytest.fixture
def area() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gyre-container-test-"))
    path.chmod(0o755)  # a prepared container's user (nobody) passes through it
    (path / "ws").mkdir()
    (path / "ro").mkdir()
    (path / "ro" / "given.txt").write_text("read me\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _binds(area: Path) -> list[Bind]:
    return [Bind(area / "ws", "/app", writable=True), Bind(area / "ro", "/tests")]


def test_exit_code_output_and_an_environment_built_from_nothing(
    box: ContainerSandbox, area: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    ran = box.run(
        ["sh", "-c", "env; echo to-stderr >&2; exit 3"],
        workdir="/app",
        binds=_binds(area),
        env={"TASK_VAR": "1"},
        timeout_s=60,
    )
    assert (ran.exit_code, ran.timed_out, ran.stderr) == (3, False, "to-stderr\n")
    env = dict(line.split("=", 1) for line in ran.stdout.splitlines())
    assert env["TASK_VAR"] == "1" and env["HOME"] == "/app" and env["LANG"] == "C.UTF-8"
    assert "secret" not in ran.stdout
    # podman's compatibility API adds its own markers; the CLI unsets everything
    extra = {"HOSTNAME", "PWD"} | ({"container", "TERM"} if box.kind == "docker" else set())
    assert set(env) - extra == {"PATH", "HOME", "LANG", "TMPDIR", "TASK_VAR"}
    with pytest.raises(SandboxError, match="gyre's own settings"):
        box.run(["env"], workdir="/app", env={"GYRE_X": "1"}, timeout_s=60)


PROBE_WRITES = """
import pathlib
for target in ["/app/ok.txt", "/tests/x.txt"]:
    try:
        pathlib.Path(target).write_text("x")
        print("wrote", target)
    except OSError as exc:
        print("refused", target, type(exc).__name__)
print("read", pathlib.Path("/tests/given.txt").read_text().strip())
"""


def test_binds_are_read_only_unless_writable(box: ContainerSandbox, area: Path) -> None:
    ran = box.run(["python3", "-c", PROBE_WRITES], workdir="/app", binds=_binds(area), timeout_s=60)
    assert ran.stdout.splitlines() == ["wrote /app/ok.txt", "refused /tests/x.txt OSError", "read read me"]
    assert (area / "ws" / "ok.txt").read_text() == "x"
    assert not (area / "ro" / "x.txt").exists()


MAPPED = """
import os, pathlib
print(os.getuid())
print(pathlib.Path("/proc/self/uid_map").read_text().split())
pathlib.Path("/app/by-root.txt").write_text("x")
try:
    os.chown("/app/by-root.txt", 70000, 70000)  # a uid outside the namespace's map
    print("chowned")
except OSError as exc:
    print("refused", type(exc).__name__)
"""


def test_a_one_off_podman_run_is_the_images_root_in_a_user_namespace_of_its_own(
    podman: PodmanSandbox, area: Path
) -> None:
    ran = podman.run(["python3", "-c", MAPPED], workdir="/app", binds=_binds(area), timeout_s=60)
    assert ran.exit_code == 0, ran.stderr
    uid, mapping, chown = ran.stdout.splitlines()
    # the image's root (Harbor's tests may install what they need), which on the host is uid 3,000,000
    assert (uid, mapping) == ("0", str(["0", str(CONTAINER_ROOT), str(CONTAINER_IDS)]))
    assert (area / "ws" / "by-root.txt").stat().st_uid == CONTAINER_ROOT == (area / "ws").stat().st_uid
    assert chown == "refused OSError"  # a host uid outside its range it cannot even name (EINVAL)


CONNECT = """
import os, socket, sys
print(sorted(os.listdir("/sys/class/net")))
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("reached")
except OSError as exc:
    print("blocked", type(exc).__name__)
"""


def test_no_network_but_its_own_loopback(box: ContainerSandbox, area: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=3).close()  # reachable from the host
        ran = box.run(["python3", "-c", CONNECT, str(port)], workdir="/app", timeout_s=60)
    assert ran.stdout.splitlines() == ["['lo']", "blocked ConnectionRefusedError"], ran.stderr


FORK = """
import os, time
children = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        children += 1
except OSError as exc:
    print("fork refused after", children, type(exc).__name__)
else:
    print("forked", children)
"""


def test_limits_on_processes_memory_file_size_and_cpu_time(box: ContainerSandbox, area: Path) -> None:
    ran = box.run(["python3", "-c", FORK], workdir="/app", timeout_s=60, limits=Limits(processes=20))
    assert ran.stdout.startswith("fork refused after"), ran.stdout + ran.stderr
    assert int(ran.stdout.split()[3]) < 20
    grab = "x = bytearray(800 * 2**20); print('allocated')"
    ran = box.run(["python3", "-c", grab], workdir="/app", timeout_s=60, limits=Limits(memory_mb=128))
    assert ran.exit_code != 0 and "allocated" not in ran.stdout
    write = "open('/app/big', 'wb').write(b'x' * (5 * 2**20))"
    ran = box.run(
        ["python3", "-c", write],
        workdir="/app",
        binds=_binds(area),
        timeout_s=60,
        limits=Limits(file_size_mb=1),
    )
    assert ran.exit_code != 0 and "File too large" in ran.stderr
    assert (area / "ws" / "big").stat().st_size <= 2**20
    ran = box.run(
        ["python3", "-c", "while True: pass"], workdir="/app", timeout_s=120, limits=Limits(cpu_s=1)
    )
    assert ran.exit_code != 0 and not ran.timed_out


def test_a_timeout_kills_and_removes_the_container(box: ContainerSandbox, area: Path) -> None:
    ran = box.run(["sh", "-c", "echo started; sleep 600"], workdir="/app", binds=_binds(area), timeout_s=3)
    assert ran.timed_out and ran.exit_code == -signal.SIGKILL
    assert _gyre_containers() == []


RUN_DOCKERFILE = """\
FROM python:3.11-slim
WORKDIR /srv/project
RUN mkdir -p /opt/gyre && echo built-by-run > /opt/gyre/marker
COPY calc.py .
"""


@pytest.fixture(scope="module")
def run_task_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fix-add, its Dockerfile with a RUN line its tests need (``/opt/gyre/marker``)."""
    folder = tmp_path_factory.mktemp("set") / "fix-add"
    shutil.copytree(HARBOR / "fix-add", folder)
    (folder / "environment" / "Dockerfile").write_text(RUN_DOCKERFILE)
    test_sh = folder / "tests" / "test.sh"
    body = test_sh.read_text().split("\n", 1)
    test_sh.write_text(f"{body[0]}\ntest -f /opt/gyre/marker || exit 1\n{body[1]}")
    return folder


def test_an_image_is_built_from_a_dockerfile_with_a_run_line_once(
    box: ContainerSandbox, run_task_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = open_source(str(run_task_folder)).tasks[0]
    assert task.unsupported == ((3, "RUN"),)
    bwrap = BwrapSandbox.__new__(BwrapSandbox)  # refusal reads only the kind and remaps
    assert "podman or docker" in (refusal(task, bwrap) or "")
    assert refusal(task, box) is None
    image = box.image_for(task.dockerfile, task.image)
    ran = box.with_image(image).run(["cat", "/opt/gyre/marker"], workdir="/srv/project", timeout_s=60)
    assert ran.stdout == "built-by-run\n", ran.stderr

    def no_build(*args: object) -> None:
        raise AssertionError("an image built before is built again")

    monkeypatch.setattr(box, "build", no_build)
    assert box.image_for(task.dockerfile, task.image) == image
    assert box.image == BASE_IMAGE  # with_image left the shared sandbox as it was
    assert check_task(task, box).verdict is Verdict.OK


def test_an_image_named_by_the_task_must_be_present(box: ContainerSandbox) -> None:
    assert box.image_for(None, BASE_IMAGE) == BASE_IMAGE
    with pytest.raises(SandboxError, match="not present locally"):
        box.image_for(None, "localhost/gyre-no-such-image:1")


@pytest.mark.parametrize("task_id", ["binary-digest", "fix-add", "write-greeting"])
def test_harbor_fixtures_keep_their_contract(box: ContainerSandbox, task_id: str) -> None:
    task = open_source(str(HARBOR)).task(task_id)
    result = check_task(task, box)
    assert (result.verdict, result.untouched is not None and result.untouched < 1.0, result.solved) == (
        Verdict.OK,
        True,
        1.0,
    ), result.detail


def _start(
    sandbox: Sandbox, command: list[str], area: Path, name: str
) -> tuple[subprocess.Popen[str], object]:
    prepared = sandbox.prepare(command, workdir="/app", name=name, binds=_binds(area), env={"GREETING": "hi"})
    proc = subprocess.Popen(
        list(prepared.argv),
        env=dict(prepared.env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, prepared.cleanup


def test_prepared_container_runs_and_its_cleanup_leaves_none(
    box: ContainerSandbox, area: Path, request: pytest.FixtureRequest
) -> None:
    name = f"prep-{box.kind}-{os.getpid()}"
    proc, cleanup = _start(box, ["sh", "-c", "echo $GREETING from $PWD; cat /tests/given.txt"], area, name)
    out, err = proc.communicate(timeout=120)
    cleanup()  # type: ignore[operator]
    assert (proc.returncode, out) == (0, "hi from /app\nread me\n"), err
    proc, cleanup = _start(box, ["sh", "-c", "echo up; sleep 600"], area, name + "-long")
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    assert _gyre_containers() == [f"gyre-{name}-long"]
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    cleanup()  # type: ignore[operator]
    assert _gyre_containers() == []


def test_a_sourced_tasks_harness_runs_in_the_tasks_image(podman: PodmanSandbox, area: Path) -> None:
    """gyre run's placement starts a harness in the image its tests run in: the task's Dockerfile
    built (fix-add's), not the base image, with the route to the proxy."""
    from gyre_proxy.harness import LaunchSpec
    from gyre_proxy.launch import ExecutionDirs
    from gyre_tools.placement import SandboxPlacement
    from gyre_train.tasks import defined_tasks

    events = {
        e.task_id: e for e in defined_tasks(str(HARBOR), "run-x", train=0, heldout=0, seed=0, budget_s=60)
    }
    dirs = ExecutionDirs(area / "exec")
    for folder in (dirs.workspace, dirs.home):
        folder.mkdir(parents=True)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    placement = SandboxPlacement("podman", proxy_url=f"http://127.0.0.1:{port}", relay_dir=area / "relay")
    try:
        built = placement.files.task(events["fix-add"])
        image = podman.image_for(built.dockerfile, built.image)
        assert image.startswith("localhost/gyre-task:")
        placed = placement.place(LaunchSpec(("sh", "-c", "true")), events["fix-add"], dirs, "place-x")
        assert image in placed.argv and BASE_IMAGE not in placed.argv
        assert "gyre-route place-x" in placed.argv  # started behind the route's forwarder
        plain = placement.place(LaunchSpec(("sh", "-c", "true")), events["binary-digest"], dirs, "place-y")
        assert BASE_IMAGE in plain.argv  # no Dockerfile, no image named: the base image
        for done in (placed, plain):
            done.cleanup()  # never started: only their scratch folders to remove
    finally:
        placement.close()

"""The cluster recipes in deploy/ hold together: the Kubernetes manifests' references between
each other (selectors, ports, Secret and ConfigMap keys, claims, volumes), every container's
``gyre`` command as the real CLI parser reads it, the run config they carry as gyre reads it,
and the Slurm scripts' shell syntax (``bash -n``; shellcheck where installed).

Nothing here needs a cluster: the manifests are read as YAML and the commands are parsed, not
run (tests/acceptance/test_deploy_slurm.py runs the Slurm recipe's processes).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gyre_tools.cli import build_parser
from gyre_tools.run_config import parse_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
SLURM_SCRIPTS = sorted((DEPLOY / "slurm").iterdir())
POD_KINDS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}
# What the downward API gives a pod, as sample values (a StatefulSet's pod index 1: the second pod).
FIELD_VALUES = {
    "status.podIP": "10.1.2.3",
    "metadata.name": "gyre-node-1",
    "metadata.labels['apps.kubernetes.io/pod-index']": "1",
}


def _documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue  # kustomize's own file, checked on its own
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["_file"] = path.name
                docs.append(doc)
    return docs


DOCS = _documents()


def _of(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in DOCS if d.get("kind") == kind}


def _workloads() -> list[dict[str, Any]]:
    return [d for d in DOCS if d.get("kind") in POD_KINDS]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def _secret_keys(name: str) -> set[str]:
    secret = _of("Secret")[name]
    return {*secret.get("stringData", {}), *secret.get("data", {})}


def _container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as Kubernetes would build it: Secret and ConfigMap values
    from the manifests, downward-API fields from FIELD_VALUES, ``$(VAR)`` of earlier ones."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = _expand_k8s(var.get("value", ""), env)
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = _of("Secret")[ref["name"]]
            env[var["name"]] = {**secret.get("stringData", {}), **secret.get("data", {})}[ref["key"]]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = str(_of("ConfigMap")[ref["name"]]["data"][ref["key"]])
        elif "fieldRef" in source:
            env[var["name"]] = FIELD_VALUES[source["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"env {var['name']}: unknown source {source}")
    return env


K8S_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand_k8s(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command, args and env values; a reference to a
    variable the container does not define (left verbatim by Kubernetes) fails here."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        assert name in env, f"$({name}) names no variable defined before it in the container"
        return env[name]

    return K8S_REFERENCE.sub(one, text)


SHELL_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")


def _expand_shell(script: str, env: dict[str, str]) -> str:
    """The ``$VAR``, ``${VAR}`` and ``$((...))`` of a ``sh -c`` script, from the container's env."""

    def variable(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in env, f"the script reads ${name}, which the container does not define"
        return env[name]

    def arithmetic(match: re.Match[str]) -> str:
        expression = SHELL_VARIABLE.sub(variable, re.sub(r"\b([A-Za-z_]\w*)\b", r"$\1", match.group(1)))
        assert re.fullmatch(r"[0-9+*\- ()]+", expression), expression
        return str(eval(expression))  # digits and + - * only, checked above

    return SHELL_VARIABLE.sub(variable, ARITHMETIC.sub(arithmetic, script))


KEYWORDS = {"exec", "until", "while", "if", "then", "do", "!"}


def _gyre_commands(container: dict[str, Any]) -> list[list[str]]:
    """The argv (after ``gyre``) of each gyre invocation the container runs: its command, or
    each simple command of its ``sh -c`` script that starts with ``gyre``."""
    env = _container_env(container)
    argv = [_expand_k8s(word, env) for word in [*container.get("command", []), *container.get("args", [])]]
    if argv[:1] == ["gyre"]:
        return [argv[1:]]
    assert argv[:2] in (["sh", "-c"], ["/bin/sh", "-c"]) and len(argv) == 3, (
        f"container {container['name']}: the command must be gyre, or sh -c running gyre: {argv}"
    )
    commands = []
    for line in _expand_shell(argv[2], env).splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token and set(token) <= set(";&|()"):
                while words and words[0] in KEYWORDS:
                    words.pop(0)
                if words[:1] == ["gyre"]:
                    commands.append([w for w in words[1:] if not re.match(r"\d*[<>]", w)])
                words = []
            else:
                words.append(token)
    assert commands, f"container {container['name']} runs no gyre command"
    return commands


def _parse(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``gyre ARGV`` as the real CLI reads it, with the container's env (the flags' fallbacks)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"gyre {shlex.join(argv)}: the CLI refuses it") from exc


def test_the_manifests_are_found_and_name_their_kinds() -> None:
    kinds = sorted(d["kind"] for d in DOCS)
    assert kinds == [
        "ConfigMap",
        "Job",
        "PersistentVolumeClaim",
        "Secret",
        "Service",
        "Service",
        "StatefulSet",
    ]
    for doc in DOCS:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc["_file"]


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert all((K8S / name).is_file() for name in listed)


@pytest.mark.parametrize("workload", _workloads(), ids=_name)
def test_workload_selectors_match_their_pod_labels(workload: dict[str, Any]) -> None:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    selector = workload["spec"].get("selector", {}).get("matchLabels")
    if workload["kind"] != "Job":  # a Job's selector is generated from its pod template
        assert selector and selector.items() <= labels.items(), (selector, labels)
    if workload["kind"] == "StatefulSet":
        service = _of("Service")[workload["spec"]["serviceName"]]
        assert service["spec"].get("clusterIP") == "None", "a StatefulSet's service is headless"
        assert service["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize("service", list(_of("Service").values()), ids=_name)
def test_each_service_selects_pods_that_have_its_ports(service: dict[str, Any]) -> None:
    selector = service["spec"]["selector"]
    pods = [
        w for w in _workloads() if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert pods, f"{_name(service)} selects no pod template"
    for port in service["spec"].get("ports", []):
        target = port.get("targetPort", port["port"])
        for pod in pods:
            container_ports = [
                p for c in pod["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
            ]
            named = {p.get("name"): p["containerPort"] for p in container_ports}
            if isinstance(target, str):
                assert target in named, f"{_name(service)} targets port {target!r}, not in {_name(pod)}"
            else:
                assert target in named.values(), f"{_name(service)} targets {target}, not in {_name(pod)}"


@pytest.mark.parametrize("workload", _workloads(), ids=_name)
def test_env_sources_volumes_and_claims_exist(workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for volume in volumes.values():
        if "persistentVolumeClaim" in volume:
            assert volume["persistentVolumeClaim"]["claimName"] in _of("PersistentVolumeClaim")
        if "configMap" in volume:
            data = _of("ConfigMap")[volume["configMap"]["name"]]["data"]
            assert {i["key"] for i in volume["configMap"].get("items", [])} <= set(data)
    for container in _containers(pod):
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{container['name']} mounts {mount['name']}, not a volume"
        for var in container.get("env", []):
            source = var.get("valueFrom", {})
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                assert ref["key"] in _secret_keys(ref["name"]), (container["name"], ref)
            if "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                assert ref["key"] in _of("ConfigMap")[ref["name"]]["data"], (container["name"], ref)
            if "fieldRef" in source:
                assert source["fieldRef"]["fieldPath"] in FIELD_VALUES, source
        _container_env(container)  # every $(VAR) in a value names an earlier variable


def test_the_shared_run_folder_is_read_write_many() -> None:
    for claim in _of("PersistentVolumeClaim").values():
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every pod writes the run's folder"


@pytest.mark.parametrize(
    "container",
    [c for w in _workloads() for c in _containers(w["spec"]["template"]["spec"])],
    ids=lambda c: c["name"],
)
def test_every_container_runs_gyre_commands_the_cli_accepts(
    container: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _container_env(container)
    for argv in _gyre_commands(container):
        args = _parse(argv, env, monkeypatch)
        assert callable(args.func), argv
        if argv[:2] != ["db", "check"] and argv[:2] != ["events", "tail"]:
            # Every serving command runs against the configured store, never embedded servers.
            assert args.database_url and args.redis_url, (container["name"], argv)


def _command_of(container_name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    [container] = [
        c
        for w in _workloads()
        for c in _containers(w["spec"]["template"]["spec"])
        if c["name"] == container_name
    ]
    [argv] = _gyre_commands(container)
    return _parse(argv, _container_env(container), monkeypatch), _container_env(container)


def test_the_head_advertises_its_pod_and_its_rendezvous_port_is_the_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args, env = _command_of("run", monkeypatch)
    assert args.command == "run" and args.run_id == _of("ConfigMap")["gyre-run"]["data"]["run-id"]
    assert env["GYRE_NODE_HOST"] == env["GYRE_PROXY_HOST"] == "0.0.0.0"
    assert env["GYRE_NODE_ADVERTISE_HOST"] == env["GYRE_PROXY_ADVERTISE_HOST"] == FIELD_VALUES["status.podIP"]
    [port] = _of("Service")["gyre-head"]["spec"]["ports"]
    assert int(env["GYRE_NODE_DIST_PORT"]) == port["port"]
    assert args.config == "/etc/gyre/run.toml"


def test_node_pods_number_their_engines_after_the_heads_and_each_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _of("ConfigMap")["gyre-run"]["data"]
    config = parse_config(data["run.toml"], where="deploy/k8s/config.yaml run.toml")
    assert int(data["head-engines"]) == config.rollout_engines, (
        "head-engines must be run.toml's rollout_engines"
    )
    args, _ = _command_of("node", monkeypatch)  # pod index 1: the second node pod
    per_node = int(data["node-engines"])
    assert args.engines == str(per_node)
    assert args.engine_offset == config.rollout_engines + 1 * per_node
    assert (args.host, args.advertise_host) == ("0.0.0.0", FIELD_VALUES["status.podIP"])
    launcher, _ = _command_of("launcher", monkeypatch)
    assert launcher.name == FIELD_VALUES["metadata.name"]  # one launcher per pod, named after it
    assert launcher.run == args.run == data["run-id"]


@pytest.mark.parametrize("script", SLURM_SCRIPTS, ids=lambda p: p.name)
def test_the_slurm_scripts_are_valid_bash(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", SLURM_SCRIPTS, ids=lambda p: p.name)
def test_the_slurm_scripts_pass_shellcheck(script: Path) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("SHELLCHECK NOT INSTALLED (apt-get install shellcheck): only bash -n checked the scripts")
    done = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout

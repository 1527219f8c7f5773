"""Each package's public API is its ``__init__`` with ``__all__``, and the packages keep to it.

- every package and subpackage names exactly what it exports: ``__all__`` is unique (ruff's
  RUF022 keeps it sorted), resolves, and every public name its ``__init__`` binds is in it;
- production code reaches another gyre package only through a package's ``__all__`` (or a
  public submodule such as ``testing``), never into its private modules;
- no lazy (function-level) import from another gyre package dodges the layering contracts;
- the torch-free parts stay torch-free in a fresh interpreter.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gyre_store", "gyre_proxy", "gyre_sched", "gyre_train")
TOP_LEVEL = {"gyre_store", "gyre_proxy", "gyre_sched", "gyre_train", "gyre_tools"}
SOURCE_DIRS = {"gyre_store": "gyre_store", "gyre_proxy": "gyre_proxy", "gyre_sched": "gyre_sched",
               "gyre_train": "gyre_train", "gyre_tools": "tools"}  # fmt: skip
# Modules that are public by name, imported as modules rather than through ``__all__``.
PUBLIC_MODULES = {"testing", "migrate"}


def _packages() -> list[str]:
    found = []
    for top in PACKAGES:
        pkg = importlib.import_module(top)
        found.append(top)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{top}."):
            if info.ispkg:
                found.append(info.name)
    return sorted(found)


def _source_files() -> list[tuple[str, Path]]:
    files = []
    for top, folder in SOURCE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files.append((".".join([top, *parts]), path))
    return files


@pytest.mark.parametrize("name", _packages())
def test_all_names_exactly_what_the_package_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__ list"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names {missing}, which it does not define"
    bound = {
        n
        for n, value in vars(module).items()
        if not n.startswith("_") and not isinstance(value, types.ModuleType) and n != "annotations"
    }
    unlisted = sorted(bound - set(exported))
    assert not unlisted, f"{name} binds public names missing from __all__: {unlisted}"


def _imports(path: Path) -> list[tuple[ast.ImportFrom | ast.Import, bool]]:
    """Every import of ``path`` with whether it sits inside a function (a lazy import)."""
    found: list[tuple[ast.ImportFrom | ast.Import, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, lazy))
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text()), False)
    return found


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def test_production_code_imports_other_packages_only_through_their_public_api() -> None:
    violations = []
    for module, path in _source_files():
        own = module.split(".")[0]
        for node, _ in _imports(path):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            target = node.module
            if target.split(".")[0] not in TOP_LEVEL or target.split(".")[0] == own:
                continue
            if target.rsplit(".", 1)[-1] in PUBLIC_MODULES:
                continue
            if not _is_package(target):
                violations.append(f"{module}: from {target} import ... (a private module)")
                continue
            exported = set(importlib.import_module(target).__all__)
            for alias in node.names:
                qualified = f"{target}.{alias.name}"
                is_submodule = alias.name in PUBLIC_MODULES or _is_package(qualified)
                if alias.name not in exported and not is_submodule:
                    violations.append(f"{module}: {alias.name} is not in {target}.__all__")
    assert not violations, "\n".join(violations)


def test_no_lazy_import_crosses_a_package_boundary() -> None:
    violations = []
    for module, path in _source_files():
        own = module.split(".")[0]
        if own == "gyre_tools":
            continue  # the CLI is the top layer: deferring an import there dodges nothing
        for node, lazy in _imports(path):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if not lazy or (isinstance(node, ast.ImportFrom) and node.level):
                continue
            for target in names:
                if target.split(".")[0] in TOP_LEVEL and target.split(".")[0] != own:
                    violations.append(f"{module} imports {target} inside a function")
    assert not violations, "\n".join(violations)


LIGHT = {
    "gyre_store": ("torch", "redis", "httpx", "starlette", "alembic"),
    "gyre_sched": ("torch", "redis", "httpx", "starlette"),
    "gyre_train": ("torch", "redis", "megatron", "transformers"),
    "gyre_train.trajectories": ("torch", "torch.distributed", "redis", "megatron"),
    "gyre_train.rewards": ("torch", "torch.distributed", "redis", "megatron"),
}


@pytest.mark.parametrize("package", sorted(LIGHT))
def test_light_packages_load_no_heavy_stack(package: str) -> None:
    probe = f"import sys, {package}; print(','.join(m for m in {LIGHT[package]!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"import {package} loaded {done.stdout.strip()}"


ROOT_ERRORS = {"gyre_store": "GyreStoreError", "gyre_proxy": "GyreProxyError",
               "gyre_sched": "GyreSchedError", "gyre_train": "GyreTrainError"}  # fmt: skip


@pytest.mark.parametrize("package", PACKAGES)
def test_one_exception_tree_per_package_drawn_in_its_exceptions_module(package: str) -> None:
    exceptions = importlib.import_module(f"{package}.exceptions")
    root = getattr(exceptions, ROOT_ERRORS[package])
    drawing = exceptions.__doc__ or ""
    stray = []
    for name, _ in _source_files():
        if not name.startswith(package + ".") and name != package:
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if not (isinstance(value, type) and issubclass(value, BaseException)):
                continue
            if value.__module__ != name:
                continue  # imported, checked where it is defined
            if (
                name != f"{package}.exceptions"
                or not issubclass(value, root)
                or value.__name__ not in drawing
            ):
                stray.append(f"{name}.{value.__name__}")
    assert not stray, f"errors outside {package}'s tree, or missing from its drawing: {stray}"


def test_every_package_is_installed() -> None:
    """pyproject.toml lists packages explicitly (two are mapped from other folders): a new
    subpackage missing there would work from the source tree and be absent from a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert on_disk <= listed, f"not in pyproject.toml's packages: {sorted(on_disk - listed)}"
    assert {"gyre_tools", "gyre_store.migrations", "gyre_store.migrations.versions"} <= listed

"""A Harbor task's Dockerfile, read for what a sandbox without an image builder can apply.

``FROM`` names the base image (kept; a namespace sandbox uses the host's root instead),
``WORKDIR`` sets where the workspace sits, ``COPY`` and ``ADD`` (local files only) write the
starting workspace from the build context, ``ENV`` sets variables. Every other instruction is
recorded with its line number in ``unsupported``: a sandbox that builds no image refuses it.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path

from gyre_train.exceptions import TaskSourceError
from gyre_train.tasks.task import DEFAULT_WORKDIR

ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".txz")


@dataclass(frozen=True, slots=True)
class DockerPlan:
    """What the Dockerfile asks for: image, final WORKDIR, ENV, copies, and what is left over."""

    image: str | None
    workdir: str
    env: dict[str, str]
    copies: tuple[tuple[Path, str], ...]  # (source in the build context, path relative to workdir)
    unsupported: tuple[tuple[int, str], ...]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with comments dropped and ``\\`` continuations joined."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        out.append((start, " ".join(p.strip() for p in pending if p.strip())))
        pending = []
    if pending:
        out.append((start, " ".join(pending)))
    return out


def read_dockerfile(path: Path) -> DockerPlan:
    """Parse ``path`` (its folder is the build context); raises TaskSourceError naming the line."""
    context = path.parent
    image: str | None = None
    workdir = DEFAULT_WORKDIR
    env: dict[str, str] = {}
    copies: list[tuple[Path, str]] = []  # destinations absolute until the final WORKDIR is known
    unsupported: list[tuple[int, str]] = []
    for number, line in _logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        where = f"{path}:{number}"
        try:
            words = shlex.split(rest)
        except ValueError as exc:
            raise TaskSourceError(f"{where}: {keyword}: {exc}") from None
        if keyword == "FROM":
            image = words[0] if words else None
        elif keyword == "WORKDIR":
            if len(words) != 1:
                raise TaskSourceError(f"{where}: WORKDIR takes one path")
            workdir = posixpath.normpath(posixpath.join(workdir, words[0]))
        elif keyword == "ENV":
            env |= _env_pairs(words, where)
        elif keyword in ("COPY", "ADD"):
            copies += _copies(keyword, words, context, workdir, where)
        else:
            unsupported.append((number, keyword))
    relative: list[tuple[Path, str]] = []
    for source, target in copies:
        if target != workdir and not target.startswith(workdir.rstrip("/") + "/"):
            raise TaskSourceError(
                f"{path}: COPY/ADD destination {target} is outside the final WORKDIR {workdir}: "
                "only the workspace is written from the build context"
            )
        relative.append((source, posixpath.relpath(target, workdir)))
    return DockerPlan(image, workdir, env, tuple(relative), tuple(unsupported))


def _env_pairs(words: list[str], where: str) -> dict[str, str]:
    if not words:
        raise TaskSourceError(f"{where}: ENV names no variable")
    if "=" not in words[0]:  # the legacy form: ENV KEY value with spaces
        return {words[0]: " ".join(words[1:])}
    pairs: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise TaskSourceError(f"{where}: ENV {word!r} is not KEY=VALUE")
        pairs[key] = value
    return pairs


def _copies(
    keyword: str, words: list[str], context: Path, workdir: str, where: str
) -> list[tuple[Path, str]]:
    if any(w.startswith("--") for w in words):
        flags = [w for w in words if w.startswith("--")]
        raise TaskSourceError(
            f"{where}: {keyword} flags {flags} are not supported; copy from the build context"
        )
    if len(words) < 2:
        raise TaskSourceError(f"{where}: {keyword} needs a source and a destination")
    *sources, dest = words
    target = posixpath.normpath(posixpath.join(workdir, dest))
    # Docker puts a file inside an existing folder; the only folder known to exist is the WORKDIR
    into_folder = dest.endswith("/") or len(sources) > 1 or target == workdir
    out: list[tuple[Path, str]] = []
    for name in sources:
        if "://" in name:
            raise TaskSourceError(
                f"{where}: {keyword} {name}: only local files of the build context are supported"
            )
        if any(ch in name for ch in "*?["):
            raise TaskSourceError(f"{where}: {keyword} {name}: wildcards are not supported; name the files")
        if keyword == "ADD" and name.endswith(ARCHIVES):
            raise TaskSourceError(
                f"{where}: ADD {name}: archives are not unpacked; unpack them into the context"
            )
        source = (context / name).resolve()
        if not source.is_relative_to(context.resolve()) or not source.exists():
            raise TaskSourceError(f"{where}: {keyword} {name}: not found in the build context {context}")
        if source.is_file() and into_folder:
            out.append((source, posixpath.join(target, source.name)))
        else:
            out.append((source, target))
    return out

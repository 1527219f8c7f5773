"""The command an execution runs to have its current work evaluated: ``.gyre/evaluate``.

The launcher writes it into every workspace. It copies the workspace (less ``.gyre``) to a
snapshot in ``GYRE_SNAPSHOTS``, names the copy by a digest of its files (``wip-<digest>``),
posts its location (as the host sees it) to the proxy's ``/gyre/v1/evaluate`` with the execution's key, and prints the evaluator's
critique, which the harness then shows the model as the command's output.
"""

from __future__ import annotations

import json
from pathlib import Path

SCRIPT = r'''#!/usr/bin/env python3
"""Ask gyre to evaluate the work in this workspace now; prints the evaluator's critique."""
import hashlib, json, os, pathlib, shutil, sys, urllib.error, urllib.request

workspace = pathlib.Path(__file__).resolve().parent.parent
files = sorted(p for p in workspace.rglob("*") if p.is_file() and ".gyre" not in p.relative_to(workspace).parts)
digest = hashlib.sha256()
for path in files:
    digest.update(str(path.relative_to(workspace)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
version = "wip-" + digest.hexdigest()[:12]
# In a sandbox the launcher writes the settings beside this command (the sandbox passes on no
# GYRE_ setting but the key), the snapshots folder appearing elsewhere than on the host.
settings_file = workspace / ".gyre" / "evaluate.json"
settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
url = settings.get("url") or os.environ["GYRE_EVALUATE_URL"]
key = os.environ.get("GYRE_EXECUTION_KEY") or os.environ["GYRE_API_KEY"]
snapshot = pathlib.Path(settings.get("snapshots") or os.environ.get("GYRE_SNAPSHOTS", workspace.parent / "snapshots")) / version
if not snapshot.exists():
    shutil.copytree(workspace, snapshot, ignore=shutil.ignore_patterns(".gyre"))
recorded = settings.get("recorded")  # the snapshots folder as the run recorded it (the host's path)
location = str(pathlib.Path(recorded) / version) if recorded else str(snapshot)
body = json.dumps({"artifact_version": version, "location": location}).encode()
request = urllib.request.Request(
    url, data=body, method="POST",
    headers={"content-type": "application/json", "authorization": "Bearer " + key},
)
try:
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
except urllib.error.HTTPError as exc:
    print(exc.read().decode(errors="replace"), file=sys.stderr)
    sys.exit(1)
print(answer["critique"] if answer["critique"] else f"{answer['status']}: score {answer['score']}")
'''


def install(workspace: Path, *, url: str = "", snapshots: str = "", recorded: str = "") -> Path:
    """Write the command into ``workspace`` and return its path. With ``url``, its settings go
    to ``.gyre/evaluate.json`` (a sandbox passes them on in no environment): where to post,
    where ``snapshots`` appear to the harness, and where the run ``recorded`` that folder."""
    path = workspace / ".gyre" / "evaluate"
    path.parent.mkdir(exist_ok=True)
    path.write_text(SCRIPT)
    path.chmod(0o755)
    if url:
        settings = {"url": url, "snapshots": snapshots, "recorded": recorded}
        (path.parent / "evaluate.json").write_text(json.dumps(settings))
    return path

"""The command an execution runs to have its current work evaluated: ``.gyre/evaluate``.

The launcher writes it into every workspace. It copies the workspace (less ``.gyre``) to a
snapshot beside it, names the copy by a digest of its files (``wip-<digest>``), posts that
to the proxy's ``/gyre/v1/evaluate`` with the execution's key, and prints the evaluator's
critique, which the harness then shows the model as the command's output.
"""

from __future__ import annotations

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
snapshot = pathlib.Path(os.environ.get("GYRE_SNAPSHOTS", workspace.parent / "snapshots")) / version
if not snapshot.exists():
    shutil.copytree(workspace, snapshot, ignore=shutil.ignore_patterns(".gyre"))
body = json.dumps({"artifact_version": version, "location": str(snapshot)}).encode()
request = urllib.request.Request(
    os.environ["GYRE_EVALUATE_URL"], data=body, method="POST",
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["GYRE_EXECUTION_KEY"]},
)
try:
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
except urllib.error.HTTPError as exc:
    print(exc.read().decode(errors="replace"), file=sys.stderr)
    sys.exit(1)
print(answer["critique"] if answer["critique"] else f"{answer['status']}: score {answer['score']}")
'''


def install(workspace: Path) -> Path:
    """Write the command into ``workspace`` and return its path."""
    path = workspace / ".gyre" / "evaluate"
    path.parent.mkdir(exist_ok=True)
    path.write_text(SCRIPT)
    path.chmod(0o755)
    return path

"""The parts of the execution and node pages that need more than the store's own records:
admission replayed with the run's settings, and recorded tokens decoded and coloured.

The store keeps token ids, not the harness's JSON, so a message is its recorded tokens decoded
with the policy's tokenizer (the run's checkpoint's ``tokenizer.json``, else the bundled Qwen3.6
vocabulary, as ``gyre export --format atif``), each token coloured by its recorded provenance.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gyre_proxy.engines import CheckpointTokenizer, Tokenizer, qwen_tokenizer
from gyre_store import GroupConsumed, Provenance, TreeView
from gyre_tools.export import run_settings
from gyre_tools.export_atif import message_spans
from gyre_tools.ui.reading import LogAt


@dataclass(frozen=True, slots=True)
class Admitted:
    """One admitted trajectory as admission replayed with the run's seed and J_max draws it."""

    draw: int
    leaf: int  # node id
    leaf_class: str
    rank: int
    target_nodes: tuple[int, ...]  # node ids whose trainable tokens are this draw's frozen targets
    target_count: int


@dataclass(frozen=True, slots=True)
class AdmissionReplay:
    seed: int
    jmax: int | None
    trajectories: list[Admitted]


def admitted(
    log: LogAt, run_id: str, view: TreeView, consumed: GroupConsumed | None
) -> AdmissionReplay | None:
    """The execution's admitted trajectories, or None when no step consumed its group (nothing
    of it was trained on, so nothing was admitted)."""
    if consumed is None:
        return None
    from gyre_train import admission_rng, admit, stored_execution

    config = run_settings(log, run_id)  # type: ignore[arg-type]  # LogAt reads as the log does
    stored = stored_execution(view)
    admission = admit(stored.tree, config.admission, admission_rng(config.seed, view.execution_id))
    return AdmissionReplay(
        seed=config.seed,
        jmax=config.admission.max_trajectories,
        trajectories=[
            Admitted(
                draw=t.draw,
                leaf=stored.node_ids[t.leaf.node],
                leaf_class=t.leaf_class.value,
                rank=t.rank,
                target_nodes=tuple(stored.node_ids[i] for i in t.target_nodes),
                target_count=t.target_count,
            )
            for t in admission.trajectories
        ],
    )


@functools.cache
def tokenizer_for(model: str | None) -> Tokenizer:
    """The checkpoint folder's tokenizer when it has one, else the bundled Qwen3.6 vocabulary."""
    if model:
        path = Path(model) / "tokenizer.json"
        if path.is_file():
            return CheckpointTokenizer(path, name=Path(model).name)
    return qwen_tokenizer()


@dataclass(frozen=True, slots=True)
class Token:
    id: int
    text: str
    provenance: str
    logprob: float | None
    trainable: bool


@dataclass(frozen=True, slots=True)
class Message:
    """One recorded message of a node: [start, end) path offsets, its main provenance, its text."""

    start: int
    end: int
    provenance: str
    text: str
    tokens: list[Token]


def node_messages(view: TreeView, node_id: int, tok: Tokenizer) -> list[Message]:
    """The node's tokens cut into the messages the tree recorded (message ends and record
    outputs), decoded, each token with its provenance, behaviour logprob and trainability."""
    node = view.nodes[node_id]
    names = {int(p): p.name.lower() for p in Provenance}
    out = []
    for start, end in message_spans(view, view.path(node_id)):
        lo, hi = max(start, node.start), min(end, node.end)
        if lo >= hi:
            continue
        a, b = lo - node.start, hi - node.start
        ids, prov = node.tokens[a:b], node.provenance[a:b]
        content = prov[prov != Provenance.TEMPLATE]
        main = int(np.bincount(content).argmax()) if content.size else int(Provenance.TEMPLATE)
        tokens = [
            Token(
                id=int(t),
                text=tok.decode([int(t)]),
                provenance=names.get(int(p), str(int(p))),
                logprob=None if node.logprobs is None else float(node.logprobs[a + i]),
                trainable=bool(node.trainable is not None and node.trainable[a + i]),
            )
            for i, (t, p) in enumerate(zip(ids.tolist(), prov.tolist(), strict=True))
        ]
        out.append(Message(lo, hi, names.get(main, str(main)), tok.decode(ids.tolist()), tokens))
    return out

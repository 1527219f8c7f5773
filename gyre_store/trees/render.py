"""Drawing a trajectory tree: a text outline and a prefix graph (PNG or SVG).

The graph follows the paper's Figure 4: message depth runs left to right, each branch
gets its own lane, a branch leaves its parent's lane where the contexts diverge, and each
leaf is labelled with its class, its messages and its trainable tokens.
"""

from __future__ import annotations

from pathlib import Path

from rich.tree import Tree

from gyre_store.catalog import LeafClass
from gyre_store.trees.view import TreeView

CLASS_COLOURS = {
    LeafClass.MAIN: "#1f77b4",
    LeafClass.MAIN_SUMMARY: "#6baed6",
    LeafClass.SUB_AGENT: "#d62728",
    LeafClass.SUB_AGENT_SUMMARY: "#ff9896",
}


def _children(view: TreeView) -> dict[int | None, list[int]]:
    kids: dict[int | None, list[int]] = {}
    for n in sorted(view.nodes.values(), key=lambda n: (n.start, n.node_id)):
        kids.setdefault(n.parent_id, []).append(n.node_id)
    return kids


def _compressed(view: TreeView) -> dict[int | None, list[int]]:
    """Branch points and leaves only: chains of single children collapse into their last node."""
    kids = _children(view)

    def tail(node: int) -> int:
        while len(kids.get(node, [])) == 1:
            node = kids[node][0]
        return node

    out: dict[int | None, list[int]] = {}
    stack: list[tuple[int | None, int]] = [(None, r) for r in kids.get(None, [])]
    while stack:
        parent, node = stack.pop()
        end = tail(node)
        out.setdefault(parent, []).append(end)
        stack.extend((end, c) for c in kids.get(end, []))
    return out


def outline(view: TreeView) -> Tree:
    """A rich Tree of branch points and leaves with message and token counts."""
    leaves = {c.leaf: c for c in view.candidates()}
    tree = Tree(f"execution {view.execution_id}")
    comp = _compressed(view)

    def label(node_id: int) -> str:
        n = view.nodes[node_id]
        text = f"messages 0..{n.path_messages}, tokens ..{n.end:,}"
        if node_id in leaves:
            c = leaves[node_id]
            text = f"[bold]{c.leaf_class.value}[/bold] leaf {c.request_id}: {text}, trainable {c.trainable_tokens:,}"
        elif n.children == 0:
            text = f"[dim]superseded leaf: {text}[/dim]"
        else:
            text = f"branch point: {text}"
        return text

    def walk(branch: Tree, parent: int | None) -> None:
        for child in comp.get(parent, []):
            walk(branch.add(label(child)), child)

    walk(tree, None)
    return tree


def draw(view: TreeView, path: Path) -> Path:
    """Write the prefix graph to ``path`` (the suffix picks PNG or SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comp = _compressed(view)
    leaves = {c.leaf: c for c in view.candidates()}
    lanes: dict[int, int] = {}
    next_lane = 0

    def assign(parent: int | None, lane_of_parent: int | None) -> None:
        nonlocal next_lane
        for i, child in enumerate(comp.get(parent, [])):
            if i == 0 and lane_of_parent is not None:
                lanes[child] = lane_of_parent
            else:
                lanes[child] = next_lane
                next_lane += 1
            assign(child, lanes[child])

    assign(None, None)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * max(next_lane, 1)))

    def depth(node: int | None) -> int:
        return 0 if node is None else view.nodes[node].path_messages

    parents = {c: p for p, cs in comp.items() for c in cs}
    for node, lane in lanes.items():
        parent = parents.get(node)
        x0, x1 = depth(parent), depth(node)
        cls = leaves[node].leaf_class if node in leaves else None
        colour = CLASS_COLOURS.get(cls, "#555555") if cls else "#555555"
        if parent is not None and lanes[parent] != lane:
            ax.plot([x0, x0], [lanes[parent], lane], color="#999999", lw=1)
        ax.plot(
            [x0, x1], [lane, lane], color=colour, lw=3 if cls in (LeafClass.MAIN, LeafClass.SUB_AGENT) else 2
        )
        if node in leaves:
            c = leaves[node]
            dashed = c.leaf_class in (LeafClass.MAIN_SUMMARY, LeafClass.SUB_AGENT_SUMMARY)
            ax.annotate(
                f"{c.leaf_class.value} ({c.path_messages} msgs, {c.trainable_tokens:,} trainable)",
                (x1, lane),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                bbox={"boxstyle": "round", "fc": "white", "ls": "--" if dashed else "-", "ec": colour},
            )
    stats = view.stats()
    ax.set_title(
        f"execution {view.execution_id}: {stats.requests} requests, {stats.unique_message_nodes} unique message nodes, "
        f"{stats.candidates} candidate trajectories",
        fontsize=10,
    )
    ax.set_xlabel("message depth")
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlim(0, max(depth(n) for n in lanes) * 1.35 + 1)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

"""Inline SVG drawn on the server: line charts, histograms, the role timeline, a trajectory tree.

Each function returns one ``<svg>`` element as a string, with its numbers in ``<title>`` and
``data-*`` attributes so a page can be read by a person and checked by a test. Nothing is
fetched: no script, font or style sheet from outside the page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from gyre_store import Provenance, TreeView

PROVENANCE_COLOURS = {
    Provenance.TEMPLATE: "#b8b8b8",
    Provenance.SYSTEM: "#9467bd",
    Provenance.USER: "#1f77b4",
    Provenance.TOOL_RESULT: "#8c564b",
    Provenance.INJECTED_ASSISTANT: "#e377c2",
    Provenance.CRITIQUE: "#ff7f0e",
    Provenance.SAMPLED: "#2ca02c",
}
ROLE_COLOURS = {"rollout": "#1f77b4", "training": "#ff7f0e", "transitioning": "#7f7f7f"}
PART_COLOURS = ("#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f", "#17becf", "#bcbd22", "#d62728")


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float
    href: str = ""
    label: str = ""


def _num(v: float) -> str:
    return f"{v:.4g}"


def _scale(lo: float, hi: float, a: float, b: float) -> Callable[[float], float]:
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def line_chart(
    series: Mapping[str, Sequence[Point]],
    *,
    xlabel: str,
    ylabel: str,
    hlines: Sequence[tuple[float, str, str]] = (),
    steps: bool = False,
    width: int = 560,
    height: int = 220,
    css_id: str = "",
) -> str:
    """Lines (``steps``: a staircase, for counts) with a marker and a link at every point."""
    points = [p for ps in series.values() for p in ps]
    if not points and not hlines:
        return '<p class="empty">nothing recorded yet</p>'
    ys = [p.y for p in points] + [v for v, _, _ in hlines]
    xs = [p.x for p in points] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, *ys), max(ys) if max(ys) > min(0.0, *ys) else min(0.0, *ys) + 1
    sx, sy = _scale(x0, x1, 50, width - 12), _scale(y0, y1, height - 34, 12)
    out = [
        f'<svg class="chart" id="{css_id}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(ylabel)} by {escape(xlabel)}">',
        f'<line x1="50" y1="{height - 34}" x2="{width - 12}" y2="{height - 34}" class="axis"/>',
        f'<line x1="50" y1="12" x2="50" y2="{height - 34}" class="axis"/>',
        f'<text x="{width // 2}" y="{height - 4}" class="lab" text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="12" y="{height // 2}" class="lab" text-anchor="middle" '
        f'transform="rotate(-90 12 {height // 2})">{escape(ylabel)}</text>',
    ]
    for v in (y0, (y0 + y1) / 2, y1):
        out.append(f'<text x="46" y="{sy(v) + 4:.1f}" class="tick" text-anchor="end">{_num(v)}</text>')
    for v in sorted({x0, x1}):
        out.append(
            f'<text x="{sx(v):.1f}" y="{height - 20}" class="tick" text-anchor="middle">{_num(v)}</text>'
        )
    for i, (value, label, colour) in enumerate(hlines):
        out.append(
            f'<line x1="50" x2="{width - 12}" y1="{sy(value):.1f}" y2="{sy(value):.1f}" stroke="{colour}" '
            f'stroke-dasharray="5 3"><title>{escape(label)}: {_num(value)}</title></line>'
            f'<text x="{width - 14}" y="{sy(value) - 3 - 11 * i:.1f}" class="tick" text-anchor="end" fill="{colour}">'
            f"{escape(label)} {_num(value)}</text>"
        )
    for colour, (name, ps) in zip(PART_COLOURS, series.items(), strict=False):
        coords: list[str] = []
        for i, p in enumerate(ps):
            if steps and i:
                coords.append(f"{sx(p.x):.1f},{sy(ps[i - 1].y):.1f}")
            coords.append(f"{sx(p.x):.1f},{sy(p.y):.1f}")
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{" ".join(coords)}"/>'
        )
        if len(ps) <= 200:
            for p in ps:
                dot = (
                    f'<circle cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="3.5" fill="{colour}" '
                    f'data-x="{p.x}" data-y="{p.y}"><title>{escape(p.label or name)}: {_num(p.y)}</title></circle>'
                )
                out.append(f'<a href="{escape(p.href)}">{dot}</a>' if p.href else dot)
    out.append("</svg>")
    return "".join(out)


def histogram(
    counts: Mapping[str, Mapping[str, int]], *, expected: float | None, measured: float | None, xlabel: str
) -> str:
    """Bars of fractions per integer value, one colour per series, with E[d] and the mean marked."""
    values = sorted({int(k) for c in counts.values() for k in c} | {0})
    if expected is not None:
        values = sorted(set(values) | {int(np.ceil(expected))})
    width, height = 420, 200
    sx = _scale(min(values) - 0.5, max(values) + 0.5, 50, width - 12)
    sy = _scale(0.0, 1.0, height - 34, 12)
    band = (sx(1) - sx(0)) * 0.8 / max(1, len(counts))
    out = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="staleness histogram">',
        f'<line x1="50" y1="{height - 34}" x2="{width - 12}" y2="{height - 34}" class="axis"/>',
        f'<text x="{width // 2}" y="{height - 4}" class="lab" text-anchor="middle">{escape(xlabel)}</text>',
    ]
    for v in values:
        out.append(f'<text x="{sx(v):.1f}" y="{height - 20}" class="tick" text-anchor="middle">{v}</text>')
    for j, (colour, (name, hist)) in enumerate(zip(("#2ca02c", "#ff7f0e"), counts.items(), strict=False)):
        total = sum(hist.values()) or 1
        for key, n in hist.items():
            x = sx(int(key)) - band * len(counts) / 2 + j * band
            out.append(
                f'<rect x="{x:.1f}" y="{sy(n / total):.1f}" width="{band:.1f}" height="{sy(0) - sy(n / total):.1f}" '
                f'fill="{colour}"><title>{escape(name)}: d = {escape(key)}, {n} of {total}</title></rect>'
            )
    for value, label, colour in ((expected, "E[d]", "#d62728"), (measured, "measured mean", "#2ca02c")):
        if value is not None:
            out.append(
                f'<line x1="{sx(value):.1f}" x2="{sx(value):.1f}" y1="12" y2="{height - 34}" stroke="{colour}" '
                f'stroke-dasharray="4 2"><title>{label} {_num(value)}</title></line>'
                f'<text x="{sx(value) + 3:.1f}" y="{22 if label == "E[d]" else 36}" class="tick" fill="{colour}">'
                f"{label} {_num(value)}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def role_timeline(
    spans: Sequence[tuple[int, str, float, float]], transitions: Sequence[tuple[int, float]]
) -> str:
    """One lane per cell: its roles over time (cell, role, start s, end s); transitions marked."""
    if not spans:
        return '<p class="empty">no cell roles recorded yet</p>'
    cells = sorted({c for c, _, _, _ in spans})
    end = max(e for _, _, _, e in spans) or 1.0
    width, lane = 640, 22
    height = 40 + lane * len(cells)
    sx = _scale(0.0, end, 70, width - 12)
    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           'aria-label="role timeline">']  # fmt: skip
    for i, cell in enumerate(cells):
        out.append(f'<text x="64" y="{16 + i * lane + 11}" class="tick" text-anchor="end">cell {cell}</text>')
    for cell, role, start, stop in spans:
        y = 16 + cells.index(cell) * lane
        out.append(
            f'<rect x="{sx(start):.1f}" y="{y}" width="{max(1.0, sx(stop) - sx(start)):.1f}" height="{lane - 6}" '
            f'fill="{ROLE_COLOURS.get(role, "#000")}" class="role" data-role="{escape(role)}">'
            f"<title>cell {cell} {escape(role)} {start:.1f} s to {stop:.1f} s</title></rect>"
        )
    for cell, at in transitions:
        if cell in cells:
            y = 16 + cells.index(cell) * lane
            out.append(f'<path d="M{sx(at):.1f} {y - 3} l-4 -6 h8 z" fill="#000"><title>transition at {at:.1f} s'
                       "</title></path>")  # fmt: skip
    out.append(f'<text x="{width // 2}" y="{height - 4}" class="lab" text-anchor="middle">seconds since the run '
               f"started (0 to {end:.1f})</text></svg>")  # fmt: skip
    return "".join(out)


def stacked_parts(rows: Sequence[tuple[str, float, Mapping[str, float]]]) -> str:
    """One bar per cell (name, span s, parts in s), split into its parts."""
    if not rows:
        return '<p class="empty">no cell time recorded yet</p>'
    names = sorted({k for _, _, parts in rows for k in parts})
    colour = {k: PART_COLOURS[i % len(PART_COLOURS)] for i, k in enumerate(names)}
    width, lane = 640, 22
    height = 30 + lane * len(rows) + 18 * ((len(names) + 3) // 4)
    longest = max(span for _, span, _ in rows) or 1.0
    sx = _scale(0.0, longest, 190, width - 12)
    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           'aria-label="where the cells\' time went">']  # fmt: skip
    for i, (name, _span, parts) in enumerate(rows):
        y, x = 8 + i * lane, sx(0.0)
        out.append(f'<text x="184" y="{y + 12}" class="tick" text-anchor="end">{escape(name)}</text>')
        for part, seconds in parts.items():
            w = sx(seconds) - sx(0.0)
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane - 6}" fill="{colour[part]}">'
                       f"<title>{escape(name)}: {escape(part)} {seconds:.2f} s</title></rect>")  # fmt: skip
            x += w
    for i, part in enumerate(names):
        x, y = 190 + (i % 4) * 110, 20 + lane * len(rows) + 18 * (i // 4)
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour[part]}"/>'
                   f'<text x="{x + 14}" y="{y}" class="tick">{escape(part)}</text>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def main_provenance(view: TreeView, node_id: int) -> Provenance:
    """The provenance most of a node's tokens have, chat-template markup aside."""
    prov = view.nodes[node_id].provenance
    content = prov[prov != Provenance.TEMPLATE]
    if not content.size:
        return Provenance.TEMPLATE
    return Provenance(int(np.bincount(content).argmax()))


def tree(view: TreeView, href: Callable[[int], str], targets: Mapping[int, int], width: int = 1100) -> str:
    """The trajectory tree: token offset left to right, a lane per branch, a box per node in its
    main provenance's colour, linking to the node; admitted target nodes outlined (``targets``:
    node id -> draw). A branch leaves its parent's lane where its context diverges."""
    kids: dict[int | None, list[int]] = {}
    for n in sorted(view.nodes.values(), key=lambda n: (n.start, n.node_id)):
        kids.setdefault(n.parent_id, []).append(n.node_id)
    lane: dict[int, int] = {}
    lanes = 0
    stack = [(r, -1) for r in reversed(kids.get(None, []))]
    while stack:  # depth first: the first child keeps its parent's lane, later ones open new lanes
        node, parent_lane = stack.pop()
        siblings = kids.get(view.nodes[node].parent_id, [])
        if parent_lane < 0 or siblings[0] != node:
            parent_lane, lanes = lanes, lanes + 1
        lane[node] = parent_lane
        stack.extend((c, parent_lane) for c in reversed(kids.get(node, [])))
    end = max(n.end for n in view.nodes.values()) or 1
    step = 14
    height = 30 + step * lanes
    sx = _scale(0.0, float(end), 10, width - 10)
    leaves = {c.leaf: c for c in view.candidates()}
    out = [
        f'<svg class="tree" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="trajectory tree of {escape(view.execution_id)}" data-nodes="{len(view.nodes)}">'
    ]
    for node_id, n in view.nodes.items():
        if n.parent_id is not None and lane[n.parent_id] != lane[node_id]:
            x = sx(n.start)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{10 + step * lane[n.parent_id] + 5}" '
                       f'y2="{10 + step * lane[node_id] + 5}" class="edge"/>')  # fmt: skip
    for node_id, n in view.nodes.items():
        x, y = sx(n.start), 10 + step * lane[node_id]
        w = max(1.5, sx(n.end) - x)
        prov = main_provenance(view, node_id)
        extra = ' stroke="#000" stroke-width="1.5"' if node_id in targets else ""
        title = f"node {node_id}: {n.kind}, tokens {n.start}..{n.end}, {prov.name.lower()}"
        if node_id in targets:
            title += f", target of admitted trajectory {targets[node_id]}"
        if node_id in leaves:
            title += f", {leaves[node_id].leaf_class.value} leaf"
        out.append(
            f'<a href="{escape(href(node_id))}" class="node" data-node="{node_id}"><rect x="{x:.1f}" y="{y}" '
            f'width="{w:.1f}" height="10" fill="{PROVENANCE_COLOURS[prov]}"{extra}/><title>{escape(title)}</title></a>'
        )
    out.append(f'<text x="10" y="{height - 4}" class="tick">token offset 0 to {end:,}; {len(view.nodes)} nodes, '
               f"{lanes} lanes</text></svg>")  # fmt: skip
    return "".join(out)

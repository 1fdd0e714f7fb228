"""`hrag view`: the project's graph as one self-contained HTML page (sigma.js drawing with WebGL, graphology
holding the graph, both vendored under vendor/ and inlined), so it opens from disk with no network.

What is shown: the whole graph (documents, chunks, entities) while it has at most `max_nodes` nodes, else the
`max_nodes` most connected entities (`--select top:N`, export's selection code); `--select` picks anything
`hrag export --select` does instead. The layout is computed here with igraph, so the browser only draws.
Each node carries what its details panel shows: an entity's type, description, aliases and the chunks it
comes from (with their documents), a chunk's text, a document's path.
"""

from __future__ import annotations

import math
import os
import random
import webbrowser
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from hrag_cli.core import store
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.export.model import EDGE_TYPES, ExportGraph, Node
from hrag_cli.export.run import load_export_graph, select_subgraph

DEFAULT_OUTPUT = Path("graph.html")
DEFAULT_MAX_NODES = 2000
SNIPPET_CHARS = 400        # of a chunk's text, in the details panel
DESCRIPTION_CHARS = 2000
CHUNKS_PER_NODE = 20       # chunks listed for one entity; the panel says how many more there are
# colour-blind-safe-ish categorical palette (Tableau 10), then grey for the entity types beyond it
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
OTHER_COLOUR = "#9e9e9e"
DOCUMENT_COLOUR, CHUNK_COLOUR = "#2f2f2f", "#c7c7c7"
EDGE_STYLE = {  # kind: (colour, width, directed)
    "RELATION": ("#7190c0", 1.5, True), "SYNONYM": ("#e8a33d", 1.5, False), "MENTIONED_IN": ("#d6d6d6", 0.6, True),
    "PART_OF": ("#505050", 0.8, True), "NEXT_CHUNK": ("#b9a6d3", 0.8, True),
}
KINDS = ("Document", "Chunk", "Entity")
GAP = 30.0                 # layout units: a component of k nodes gets a square of side GAP * sqrt(k)


@dataclass
class ViewOptions:
    output: Path = DEFAULT_OUTPUT
    select: str | None = None
    hops: int = 1
    max_nodes: int = DEFAULT_MAX_NODES
    open_browser: bool = False


def choose(full: ExportGraph, select: str | None, hops: int, max_nodes: int) -> tuple[ExportGraph, str]:
    """The graph to draw and a note saying what was cut, if anything."""
    if max_nodes < 1:
        raise UsageError("--max-nodes must be 1 or more")
    if select:
        shown = select_subgraph(full, select, hops)
        return shown, f"selection {select}"
    if len(full.nodes) <= max_nodes:
        return full, ""
    shown = select_subgraph(full, f"top:{max_nodes}")
    n_entities = sum(1 for n in full.nodes if n.label == "Entity")
    return shown, (f"the {len(shown.nodes):,} most connected of {n_entities:,} entities "
                   f"(whole graph: {len(full.nodes):,} nodes)")


def layout(graph: ExportGraph) -> list[tuple[float, float]]:
    """Positions: each connected component laid out on its own (igraph's Fruchterman-Reingold, its grid
    variant above 1,000 nodes) at a size that grows with the square root of its node count, then the components
    packed in rows, largest first. Laid out together, the force that pushes components apart leaves a tight
    ball ringed by scattered small pieces; packed, every part gets room. Scaled to about 0-1000."""
    import igraph

    n = len(graph.nodes)
    if n == 0:
        return []
    index = {node.id: i for i, node in enumerate(graph.nodes)}
    g = igraph.Graph(n=n, edges=[(index[e.source], index[e.target]) for e in graph.edges if e.source != e.target])
    g.simplify()
    pos = [(0.0, 0.0)] * n
    # igraph draws its layout noise from Python's `random` unless told otherwise: a private generator makes
    # the same graph come out the same way every time, without touching anyone's global random state
    igraph.set_random_number_generator(random.Random(7))
    try:
        boxes = _component_boxes(g)
    finally:
        igraph.set_random_number_generator(random)
    # shelf packing: rows as wide as the largest component or the square root of the total area
    row_width = max(max(b[2] for b in boxes), math.sqrt(sum(b[2] * b[3] for b in boxes)))
    x = y = row_h = 0.0
    for members, coords, w, h in boxes:
        if x > 0 and x + w > row_width:
            x, y, row_h = 0.0, y + row_h, 0.0
        for v, (cx, cy) in zip(members, coords):
            pos[v] = (x + cx, y + cy)
        x += w
        row_h = max(row_h, h)
    span = max(max(p[0] for p in pos), max(p[1] for p in pos)) or 1.0
    # graph y grows upwards in sigma: flip so the first row is drawn at the top
    return [(round(px * 1000 / span, 2), round((span - py) * 1000 / span, 2)) for px, py in pos]


def _component_boxes(g: Any) -> list[tuple[list[int], list[tuple[float, float]], float, float]]:
    """Each connected component's members, their positions inside its box, and the box's width and height;
    largest component first."""
    boxes = []
    for members in sorted(g.connected_components(), key=lambda c: (-len(c), c[0])):
        side = GAP * math.sqrt(len(members))
        if len(members) == 1:
            coords = [(0.0, 0.0)]
        else:
            sub = g.induced_subgraph(members)
            raw = sub.layout_fruchterman_reingold(niter=_iterations(len(members)), seed=_circle(len(members))).coords
            xs, ys = [c[0] for c in raw], [c[1] for c in raw]
            x0, y0 = min(xs), min(ys)
            scale = side / (max(max(xs) - x0, max(ys) - y0) or 1.0)
            coords = [((x - x0) * scale, (y - y0) * scale) for x, y in raw]
        w = max(c[0] for c in coords) + GAP
        h = max(c[1] for c in coords) + GAP
        boxes.append((members, coords, w, h))
    return boxes


def _iterations(n: int) -> int:
    """igraph's 500 up to 2,000 nodes, fewer above (down to 100), so drawing tens of thousands of nodes stays
    within a minute: the time is nodes x iterations."""
    return max(100, min(500, 1_000_000 // n))


def _circle(n: int) -> list[list[float]]:
    """A fixed start for the layout, so the same graph is drawn the same way every time."""
    r = math.sqrt(n)
    return [[r * math.cos(2 * math.pi * i / n), r * math.sin(2 * math.pi * i / n)] for i in range(n)]


def _label(node: Node, docs: dict[str, str]) -> str:
    if node.label == "Entity":
        return str(node.props.get("name") or node.id.partition(":")[2])
    if node.label == "Chunk":
        path = docs.get(str(node.props.get("doc_id", "")), "")
        return f"{os.path.basename(path) or node.id} #{node.props.get('order', '?')}"
    if node.label == "Document":
        return str(node.props.get("path") or node.id)
    return node.id


def payload(full: ExportGraph, shown: ExportGraph, note: str) -> dict[str, Any]:
    """What the page's script reads: columns for the nodes and edges, groups and edge kinds for colours and
    the legend, and the details of each node (entity chunks point into one shared chunk table)."""
    docs = {str(n.props.get("doc_id") or n.id.partition(":")[2]): str(n.props.get("path", n.id))
            for n in full.nodes if n.label == "Document"}
    chunk_nodes = {n.id.partition(":")[2]: n for n in full.nodes if n.label == "Chunk"}
    type_count: dict[str, int] = {}
    for n in shown.nodes:
        if n.label == "Entity":
            t = str(n.props.get("type") or "unknown")
            type_count[t] = type_count.get(t, 0) + 1
    types = sorted(type_count, key=lambda t: (-type_count[t], t))
    coloured = types[:len(PALETTE)]
    groups = [{"name": "Document", "color": DOCUMENT_COLOUR, "count": 0},
              {"name": "Chunk", "color": CHUNK_COLOUR, "count": 0}]
    groups += [{"name": t, "color": PALETTE[i], "count": 0} for i, t in enumerate(coloured)]
    if len(types) > len(coloured):
        groups.append({"name": "other entity types", "color": OTHER_COLOUR, "count": 0})
    group_of = {g["name"]: i for i, g in enumerate(groups)}

    doc_paths: list[str] = []
    doc_index: dict[str, int] = {}
    chunks: list[list[Any]] = []
    chunk_index: dict[str, int] = {}

    def chunk_ref(chunk_id: str) -> int | None:
        if chunk_id in chunk_index:
            return chunk_index[chunk_id]
        node = chunk_nodes.get(chunk_id)
        if node is None:
            return None
        path = docs.get(str(node.props.get("doc_id", "")), str(node.props.get("doc_id", "?")))
        if path not in doc_index:
            doc_index[path] = len(doc_paths)
            doc_paths.append(path)
        text = str(node.props.get("text", ""))
        snippet = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS].rstrip() + " …"
        chunk_index[chunk_id] = len(chunks)
        chunks.append([doc_index[path], node.props.get("order", 0), snippet])
        return chunk_index[chunk_id]

    degree: dict[str, int] = {}
    for e in shown.edges:
        degree[e.source] = degree.get(e.source, 0) + 1
        degree[e.target] = degree.get(e.target, 0) + 1
    cols: dict[str, list[Any]] = {"id": [], "label": [], "kind": [], "group": [], "size": [], "x": [], "y": []}
    info: list[dict[str, Any] | None] = []
    for node, (x, y) in zip(shown.nodes, layout(shown)):
        kind = node.label if node.label in KINDS else "Entity"
        if kind == "Entity":
            t = str(node.props.get("type") or "unknown")
            group = group_of.get(t, group_of.get("other entity types", 0))
        else:
            group = group_of[kind]
        groups[group]["count"] += 1
        base = 2.5 if kind == "Chunk" else 4.0 if kind == "Document" else 3.0
        cols["id"].append(node.id)
        cols["label"].append(_label(node, docs))
        cols["kind"].append(KINDS.index(kind))
        cols["group"].append(group)
        cols["size"].append(round(min(base + 1.2 * math.sqrt(degree.get(node.id, 0)), 15.0), 1))
        cols["x"].append(x)
        cols["y"].append(y)
        item: dict[str, Any] = {}
        if kind == "Entity":
            desc = str(node.props.get("description") or "")
            item = {"t": node.props.get("type") or "", "d": desc[:DESCRIPTION_CHARS],
                    "a": list(node.props.get("aliases") or [])}
            refs = [r for r in (chunk_ref(c) for c in node.props.get("source_ids") or []) if r is not None]
            item["c"] = refs[:CHUNKS_PER_NODE]
            if len(refs) > CHUNKS_PER_NODE:
                item["more"] = len(refs) - CHUNKS_PER_NODE
        elif kind == "Chunk":
            ref = chunk_ref(node.id.partition(":")[2])
            item = {"c": [ref]} if ref is not None else {}
        elif kind == "Document":
            item = {"p": str(node.props.get("path", ""))}
        info.append({k: v for k, v in item.items() if v not in ("", [], None)} or None)

    index = {nid: i for i, nid in enumerate(cols["id"])}
    kinds = list(EDGE_TYPES) + sorted({e.type for e in shown.edges} - set(EDGE_TYPES))
    kind_index = {k: i for i, k in enumerate(kinds)}
    edge_kinds = [{"name": k, "color": EDGE_STYLE.get(k, ("#aaaaaa", 1.0, True))[0],
                   "size": EDGE_STYLE.get(k, ("#aaaaaa", 1.0, True))[1],
                   "directed": EDGE_STYLE.get(k, ("#aaaaaa", 1.0, True))[2], "count": 0} for k in kinds]
    edges: dict[str, list[int]] = {"s": [], "t": [], "k": []}
    for e in shown.edges:
        edges["s"].append(index[e.source])
        edges["t"].append(index[e.target])
        edges["k"].append(kind_index[e.type])
        edge_kinds[kind_index[e.type]]["count"] += 1
    return {"note": note, "kinds": list(KINDS), "groups": groups, "edgeKinds": edge_kinds, "nodes": cols,
            "edges": edges, "info": info, "chunks": chunks, "docs": doc_paths}


def _vendor(name: str) -> str:
    text = resources.files("hrag_cli.view").joinpath("vendor", name).read_text(encoding="utf-8")
    # the source map is not shipped: drop its pointer so no tool goes looking for it
    return "\n".join(line for line in text.splitlines() if not line.startswith("//# sourceMappingURL="))


def render_html(data: dict[str, Any], title: str) -> str:
    from hrag_cli.export.formats import xml_text

    template = resources.files("hrag_cli.view").joinpath("template.html").read_text(encoding="utf-8")
    # "<" only occurs inside JSON strings, where \u003c means the same: no "</script>" can end the block early
    blob = orjson.dumps(data).decode("utf-8").replace("<", "\\u003c")
    parts = {"@@TITLE@@": xml_text(title), "@@GRAPHOLOGY@@": _vendor("graphology.umd.min.js"),
             "@@SIGMA@@": _vendor("sigma.min.js"), "@@DATA@@": blob}
    out = template
    for marker in ("@@TITLE@@", "@@GRAPHOLOGY@@", "@@SIGMA@@"):
        out = out.replace(marker, parts[marker])
    head, _, tail = out.partition("@@DATA@@")     # last: the data may hold any marker text
    return head + blob + tail


def _check_output(project: ProjectDir, output: Path) -> Path:
    out = Path(output)
    root, target = project.root.resolve(), out.resolve()
    if target == root or root in target.parents:
        raise UsageError(f"--output {out} is inside the project folder {project.root}; view never writes there")
    if out.is_dir():
        raise UsageError(f"--output {out} is a folder; give a file name such as {out / DEFAULT_OUTPUT}")
    return out


def run_view(project: ProjectDir, options: ViewOptions) -> dict[str, Any]:
    """Write the page; open it in the user's browser when asked. Returns a summary."""
    output = _check_output(project, options.output)
    project.require()
    full = load_export_graph(project)
    shown, note = choose(full, options.select, options.hops, options.max_nodes)
    data = payload(full, shown, note)
    html = render_html(data, f"hrag · {project.root.resolve().name}")
    store.atomic_write_text(output, html)
    summary: dict[str, Any] = {"output": str(output), "nodes": len(shown.nodes), "edges": len(shown.edges),
                               "bytes": len(html.encode("utf-8"))}
    if note:
        summary["shown"] = note
    if options.open_browser:
        opened = webbrowser.open(output.resolve().as_uri())
        summary["opened"] = bool(opened)
        if not opened:
            summary["open"] = f"no browser found: open {output.resolve().as_uri()} yourself"
    return summary

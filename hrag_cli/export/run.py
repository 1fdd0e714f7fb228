"""`hrag export`: turn the project's graph into a neutral node/edge model, optionally cut a subgraph, and hand
it to one writer (GraphML, JSONL, CSV, Cypher) or to the FalkorDB loader.

Why a neutral model: every format needs the same things (stable ids, a label per node, a type and a direction
per edge, typed properties with chunk text and entity aliases joined in from the JSONL artifacts), so they are
worked out once here and the writers stay small. Export only reads the project: it never takes the writer lock
and refuses an output path inside the project folder.

`--output -` writes the single-file formats (GraphML, Cypher) to standard output.

Ids: "doc:<doc_id>", "chunk:<chunk_id>", "entity:<entity id>". Labels: Document, Chunk, Entity. Edge types and
directions: PART_OF chunk->document, NEXT_CHUNK earlier->later chunk, RELATION src->tgt of the relation record,
MENTIONED_IN entity->chunk, SYNONYM a->b.

--select syntax (terms separated by commas, applied left to right; `around:` must come last since a name may
contain commas):
  entities        entity nodes only, with the edges between them (RELATION, SYNONYM)
  top:N           the N entities with the most edges to other entities, then the most edges of any kind (in
                  what is selected so far; ties by id), with the edges between them
  around:NAME     the entity NAME (matched by normalised name, then by alias) and every node within --hops
                  hops of it in what is selected so far, with the edges among them
  e.g. "entities,around:Port Ellery" = the entity neighbourhood without chunks and documents.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.export.model import ID_PREFIX, LABELS, Edge, ExportGraph, Node, clean_value
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir

FORMATS = ("graphml", "jsonl", "csv", "cypher", "falkordb")
STDOUT = Path("-")        # --output - : the single-file formats write to standard output
# igraph attributes that the model turns into structure (id, label) rather than properties
_STRUCTURAL = {"kind"}


@dataclass
class ExportOptions:
    fmt: str
    output: Path | None = None
    url: str | None = None
    graph: str = "hrag"
    select: str | None = None
    hops: int = 1
    progress: bool = False


def _props(raw: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in raw.items():
        if v is None:
            continue
        cv = clean_value(v)
        if cv is not None:
            out[k] = cv
    return out


# -- building the model from the project ------------------------------------------------------------------
def _fill(raw: dict[str, Any], record: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Take from the JSONL record what the igraph graph does not carry (text bodies, lists)."""
    for k in keys:
        if raw.get(k) is None and record.get(k) is not None:
            raw[k] = record[k]


def build_export_graph(g: Any, project: ProjectDir | None = None) -> ExportGraph:
    """The igraph graph (docs/design.md) plus the text bodies and lists that live in the JSONL artifacts."""
    docs: dict[str, dict] = {}
    chunks: dict[str, dict] = {}
    entities: dict[str, dict] = {}
    relations: dict[frozenset, dict] = {}
    if project is not None:
        docs = {d["doc_id"]: d for d in store.read_jsonl(project.docs_path) if "doc_id" in d}
        chunks = {c["chunk_id"]: c for c in store.read_jsonl(project.chunks_path) if "chunk_id" in c}
        entities = {e["id"]: e for e in store.read_jsonl(project.entities_path) if "id" in e}
        for r in store.read_jsonl(project.relations_path):
            if "src" in r and "tgt" in r:
                relations[frozenset((r["src"], r["tgt"]))] = r

    # whole attribute columns at once: per-vertex attribute access is the slow path in igraph
    vattrs = [a for a in g.vs.attributes() if a not in _STRUCTURAL]
    vcols = [g.vs[a] for a in vattrs]
    vkinds = g.vs["kind"] if g.vcount() else []
    vkeys = [str(k) for k in g.vs["key"]] if g.vcount() else []
    out = ExportGraph()
    ids: list[str] = []
    for i, (kind, key) in enumerate(zip(vkinds, vkeys)):
        raw = {a: col[i] for a, col in zip(vattrs, vcols) if col[i] is not None}
        if kind == "document":
            _fill(raw, docs.get(key, {}), ("path", "sha256", "bytes", "n_chunks", "metadata"))
            if raw.get("metadata") == {}:
                raw["metadata"] = None
        elif kind == "chunk":
            _fill(raw, chunks.get(key, {}), ("doc_id", "order", "n_tokens", "text"))
        elif kind == "entity":
            _fill(raw, entities.get(key, {}), ("name", "type", "description", "aliases", "source_ids"))
        node_id = ID_PREFIX.get(kind, f"{kind}:") + key
        out.nodes.append(Node(node_id, LABELS.get(kind, str(kind).capitalize()), _props(raw)))
        ids.append(node_id)

    eattrs = [a for a in g.es.attributes() if a not in _STRUCTURAL]
    ecols = [g.es[a] for a in eattrs]
    ekinds = g.es["kind"] if g.ecount() else []
    orders = g.vs["order"] if "order" in g.vs.attributes() else [None] * g.vcount()
    for j, ((s, t), etype) in enumerate(zip(g.get_edgelist(), ekinds)):
        etype = str(etype)
        raw = {a: col[j] for a, col in zip(eattrs, ecols) if col[j] is not None}
        if raw.get("weight") is not None:
            raw["weight"] = float(raw["weight"])
        if etype == "PART_OF" and vkinds[s] == "document":
            s, t = t, s
        elif etype == "MENTIONED_IN" and vkinds[s] == "chunk":
            s, t = t, s
        elif etype == "NEXT_CHUNK" and orders[s] is not None and orders[t] is not None and orders[s] > orders[t]:
            s, t = t, s
        elif etype == "RELATION":
            a, b = vkeys[s], vkeys[t]
            rec = relations.get(frozenset((a, b)))
            if rec is not None:
                if rec["src"] == b and rec["tgt"] == a and a != b:
                    s, t = t, s
                raw = {"key": rec.get("id"), **raw}
                _fill(raw, rec, ("predicates", "keywords", "description", "source_ids", "rel_type"))
        out.edges.append(Edge(ids[s], ids[t], etype, _props(raw)))
    return out


def load_export_graph(project: ProjectDir) -> ExportGraph:
    if not project.graph_path.exists():
        raise UsageError(f"project {project.root} has no graph yet (run 'hrag index DOCS' first)")
    project.require_intact()
    from hrag_cli.graph.model import load_graph

    g, _ = load_graph(project)
    return build_export_graph(g, project)


# -- --select -----------------------------------------------------------------------------------------------
def _find_entity(graph: ExportGraph, name: str) -> Node:
    from hrag_cli.core.normalize import normalize_name

    want = normalize_name(name)
    if not want:
        raise UsageError(f"--select around:{name!r}: not a usable entity name")
    entities = [n for n in graph.nodes if n.label == "Entity"]
    for n in entities:
        if n.id == ID_PREFIX["entity"] + want:
            return n
    for n in entities:
        if normalize_name(str(n.props.get("name", ""))) == want:
            return n
    for n in entities:
        if any(normalize_name(a) == want for a in n.props.get("aliases", [])):
            return n
    import difflib

    names = [str(n.props.get("name", n.id)) for n in entities]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise UsageError(f"--select around:{name}: no entity with that name{hint}")


def _induced(graph: ExportGraph, keep: set[str]) -> ExportGraph:
    return ExportGraph([n for n in graph.nodes if n.id in keep],
                       [e for e in graph.edges if e.source in keep and e.target in keep])


def _count(term: str) -> int:
    value = term[len("top:"):].strip()
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--select {term!r}: write top:N with N a whole number of entities, e.g. top:500")
    return int(value)


def top_entities(graph: ExportGraph, n: int) -> set[str]:
    """The ids of the n entities with the most edges to other entities (RELATION, SYNONYM) in `graph`, then the
    most edges of any kind (mentions), then by id: ranked on links among entities, the cut keeps a connected
    picture rather than many often-mentioned entities with nothing between them."""
    entities = {n_.id for n_ in graph.nodes if n_.label == "Entity"}
    linked: dict[str, int] = {}
    degree: dict[str, int] = {}
    for e in graph.edges:
        degree[e.source] = degree.get(e.source, 0) + 1
        degree[e.target] = degree.get(e.target, 0) + 1
        if e.source in entities and e.target in entities:
            linked[e.source] = linked.get(e.source, 0) + 1
            linked[e.target] = linked.get(e.target, 0) + 1
    ranked = sorted(entities, key=lambda i: (-linked.get(i, 0), -degree.get(i, 0), i))
    return set(ranked[:n])


def select_subgraph(graph: ExportGraph, select: str | None, hops: int = 1) -> ExportGraph:
    """Apply a --select expression (module docstring); None or 'all' keeps everything."""
    if select is None or select.strip() in ("", "all"):
        return graph
    if hops < 0:
        raise UsageError("--hops must be 0 or more")
    rest = select.strip()
    while rest:
        if rest.startswith("around:"):
            name = rest[len("around:"):].strip()
            rest = ""
            centre = _find_entity(graph, name)
            adj: dict[str, list[str]] = {}
            for e in graph.edges:
                adj.setdefault(e.source, []).append(e.target)
                adj.setdefault(e.target, []).append(e.source)
            seen = {centre.id: 0}
            queue = deque([centre.id])
            while queue:
                cur = queue.popleft()
                if seen[cur] >= hops:
                    continue
                for nb in adj.get(cur, ()):
                    if nb not in seen:
                        seen[nb] = seen[cur] + 1
                        queue.append(nb)
            graph = _induced(graph, set(seen))
            continue
        term, _, rest = rest.partition(",")
        term, rest = term.strip(), rest.strip()
        if term == "entities":
            graph = _induced(graph, {n.id for n in graph.nodes if n.label == "Entity"})
        elif term.startswith("top:"):
            graph = _induced(graph, top_entities(graph, _count(term)))
        elif term in ("", "all"):
            continue
        else:
            raise UsageError(f"--select: unknown term {term!r} (use 'entities', 'top:N', 'around:NAME', or "
                             "several separated by commas)")
    return graph


# -- the command ------------------------------------------------------------------------------------------
def _check_output(project: ProjectDir, output: Path | None, fmt: str) -> Path:
    if output is None:
        what = "a file" if fmt in ("graphml", "cypher") else "a folder"
        raise UsageError(f"--format {fmt} needs --output/-o ({what})")
    out = Path(output)
    if out == STDOUT:
        if fmt not in ("graphml", "cypher"):
            raise UsageError(f"--output - (standard output) takes one file; --format {fmt} writes a folder of "
                             "files: give a folder path")
        return out
    root = project.root.resolve()
    target = out.resolve()
    if target == root or root in target.parents:
        raise UsageError(f"--output {out} is inside the project folder {project.root}; export never writes there")
    if fmt in ("graphml", "cypher") and out.is_dir():
        raise UsageError(f"--output {out} is a folder; --format {fmt} writes one file")
    if fmt in ("jsonl", "csv") and out.exists() and not out.is_dir():
        raise UsageError(f"--output {out} is a file; --format {fmt} writes a folder of files")
    return out


def run_export(project: ProjectDir, settings: Settings, reporter: Reporter, options: ExportOptions,
               stdout: BinaryIO | None = None) -> dict:
    """Read the project, cut the selection, write one format (or load FalkorDB); returns a summary. With
    --output - the file goes to `stdout` (default: the process's standard output)."""
    fmt = (options.fmt or "").strip().lower()
    if fmt not in FORMATS:
        raise UsageError(f"unknown --format {options.fmt!r} (choose one of {', '.join(FORMATS)})")
    output: Path | None = None
    if fmt == "falkordb":
        if not options.url:
            raise UsageError("--format falkordb needs --url, e.g. redis://127.0.0.1:6379")
        if not options.graph:
            raise UsageError("--graph must not be empty")
    else:
        output = _check_output(project, options.output, fmt)
    project.require()
    graph = select_subgraph(load_export_graph(project), options.select, options.hops)
    summary: dict[str, Any] = {"format": fmt}
    if options.select:
        summary["select"] = options.select
    if fmt == "falkordb":
        from hrag_cli.export.falkordb import load_falkordb

        summary.update(load_falkordb(project, graph, options.url or "", options.graph, reporter, settings.vectors))
        return summary
    from hrag_cli.export import formats as export_formats

    assert output is not None
    if output == STDOUT:
        stream = stdout if stdout is not None else sys.stdout.buffer
        stream.write(export_formats.TEXTS[fmt](graph).encode("utf-8"))
        stream.flush()
        files = [output]
    else:
        files = export_formats.publish(export_formats.WRITERS[fmt](graph, output))
    counts = graph.counts()
    summary.update({"output": str(output), "nodes": counts["nodes"], "edges": counts["edges"],
                    "labels": counts["labels"], "types": counts["types"], "files": len(files)})
    return summary

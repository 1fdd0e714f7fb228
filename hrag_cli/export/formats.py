"""The file writers of `hrag export`: GraphML, JSONL, CSV (neo4j-admin import) and a Cypher script.

Each takes the neutral ExportGraph (export.py) and an output path, writes every file atomically through
store, and returns the paths written. Encoding choices, per format:

- GraphML is directed (`edgedefault="directed"`): RELATION src->tgt, PART_OF chunk->document, NEXT_CHUNK
  earlier->later, MENTIONED_IN entity->chunk; every edge's `kind` and a relation's `rel_type` are data. SYNONYM is
  symmetric: written once per pair, from the entity earlier in the graph's vertex order, and the graph-level
  `symmetric_kinds` ("SYNONYM") tells a reader which kinds to read both ways. (A per-edge `directed="false"`
  would say it in GraphML itself, but networkx refuses such edges in a directed graph.)
  GraphML has no list type: list properties are JSON strings (`["a", "b"]`). XML 1.0 cannot carry most
  control characters (U+0000-U+001F except tab/newline/CR), so those become U+FFFD; newlines and CR are
  written as character references so they survive parsing.
- CSV: neo4j-admin headers (`id:ID`, `:LABEL`, `:START_ID`, `:END_ID`, `:TYPE`, `weight:float`,
  `order:int`, `aliases:string[]`). Arrays are joined with ARRAY_DELIMITER (";", neo4j-admin's default); a ";"
  inside an element is replaced by ",", since neo4j-admin has no escape for it. Fields with newlines or quotes
  are quoted the standard way (quote doubled), so import with `--multiline-fields=true`.
- Cypher: one statement per line, each ending with ";". Strings are single-quoted with only the escapes
  that both FalkorDB and Neo4j read (\\ \' \" \n \r \t \b \f); every other character, any Unicode included,
  is written as itself in UTF-8. NUL cannot live in a FalkorDB string and is dropped.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from hrag_cli.core import store
from hrag_cli.export.model import EDGE_TYPES, Edge, ExportGraph, property_types

ARRAY_DELIMITER = ";"
CYPHER_BATCH_ROWS = 500
CYPHER_BATCH_CHARS = 1_000_000
NODE_LABELS = ("Document", "Chunk", "Entity")


# -- GraphML --------------------------------------------------------------------------------------------
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_XML_ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}
_XML_ESC_RE = re.compile('[&<>"\n\r\t]')


def xml_text(value: str) -> str:
    """Escape for element text and attribute values alike (line breaks as references survive both)."""
    value = _XML_BAD.sub("\ufffd", value)
    return _XML_ESC_RE.sub(lambda m: _XML_ESC[m.group()], value)


_GRAPHML_TYPES = {"string": "string", "int": "long", "float": "double", "boolean": "boolean",
                  "string[]": "string"}


def _graphml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return orjson.dumps(value).decode()
    return str(value)


SYMMETRIC_KINDS = ("SYNONYM",)


def graphml_text(graph: ExportGraph) -> str:
    """Node ids are the stable ids; `kind` holds the label in igraph's lower case, edges carry `kind` too."""
    ntypes = {"kind": "string", **property_types(graph.nodes)}
    etypes = {"kind": "string", **property_types(graph.edges)}
    nkey = {name: f"n{i}" for i, name in enumerate(ntypes)}
    ekey = {name: f"e{i}" for i, name in enumerate(etypes)}
    out: list[str] = ['<?xml version="1.0" encoding="UTF-8"?>\n',
                      '<graphml xmlns="http://graphml.graphdrawing.org/xmlns" '
                      'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
                      'xsi:schemaLocation="http://graphml.graphdrawing.org/xmlns '
                      'http://graphml.graphdrawing.org/xmlns/1.0/graphml.xsd">\n']
    for domain, types, keys in (("node", ntypes, nkey), ("edge", etypes, ekey)):
        for name, t in types.items():
            out.append(f'  <key id="{keys[name]}" for="{domain}" attr.name="{xml_text(name)}" '
                       f'attr.type="{_GRAPHML_TYPES[t]}"/>\n')
    out.append('  <key id="g0" for="graph" attr.name="symmetric_kinds" attr.type="string"/>\n')
    out.append('  <graph id="hrag" edgedefault="directed">\n')
    out.append(f'    <data key="g0">{",".join(SYMMETRIC_KINDS)}</data>\n')
    for n in graph.nodes:
        out.append(f'    <node id="{xml_text(n.id)}">')
        out.append(f'<data key="{nkey["kind"]}">{n.label.lower()}</data>')
        for k, v in n.props.items():
            out.append(f'<data key="{nkey[k]}">{xml_text(_graphml_value(v))}</data>')
        out.append("</node>\n")
    for i, e in enumerate(graph.edges):
        out.append(f'    <edge id="e{i}" source="{xml_text(e.source)}" target="{xml_text(e.target)}">')
        out.append(f'<data key="{ekey["kind"]}">{e.type}</data>')
        for k, v in e.props.items():
            out.append(f'<data key="{ekey[k]}">{xml_text(_graphml_value(v))}</data>')
        out.append("</edge>\n")
    out.append("  </graph>\n</graphml>\n")
    return "".join(out)


def write_graphml(graph: ExportGraph, path: Path) -> list[Path]:
    store.atomic_write_text(path, graphml_text(graph))
    return [Path(path)]


# -- JSONL ----------------------------------------------------------------------------------------------
def write_jsonl(graph: ExportGraph, folder: Path) -> list[Path]:
    """nodes.jsonl {id, label, ...properties}; edges.jsonl {source, target, type, ...properties}."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    store.write_jsonl(folder / "nodes.jsonl", ({"id": n.id, "label": n.label, **n.props} for n in graph.nodes))
    store.write_jsonl(folder / "edges.jsonl",
                      ({"source": e.source, "target": e.target, "type": e.type, **e.props} for e in graph.edges))
    return [folder / "nodes.jsonl", folder / "edges.jsonl"]


# -- CSV (neo4j-admin database import) -------------------------------------------------------------------
def _csv_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ARRAY_DELIMITER.join(str(v).replace(ARRAY_DELIMITER, ",") for v in value)
    return str(value)


def _csv_header(name: str, t: str) -> str:
    return name if t == "string" else f"{name}:{t}"


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(header)
    writer.writerows(rows)
    store.atomic_write_text(path, buf.getvalue())


def write_csv(graph: ExportGraph, folder: Path) -> list[Path]:
    """nodes_<Label>.csv and rels_<TYPE>.csv, plus import.sh with the matching neo4j-admin command."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    labels = list(NODE_LABELS) + sorted({n.label for n in graph.nodes} - set(NODE_LABELS))
    for label in labels:
        nodes = [n for n in graph.nodes if n.label == label]
        if not nodes:
            continue
        types = {k: t for k, t in property_types(nodes).items() if k != "id"}
        header = ["id:ID", ":LABEL"] + [_csv_header(k, t) for k, t in types.items()]
        rows = [[n.id, n.label] + [_csv_value(n.props[k]) if k in n.props else "" for k in types] for n in nodes]
        path = folder / f"nodes_{label}.csv"
        _write_csv(path, header, rows)
        written.append(path)
    etypes = list(EDGE_TYPES) + sorted({e.type for e in graph.edges} - set(EDGE_TYPES))
    for etype in etypes:
        edges = [e for e in graph.edges if e.type == etype]
        if not edges:
            continue
        types = property_types(edges)
        header = [":START_ID", ":END_ID", ":TYPE"] + [_csv_header(k, t) for k, t in types.items()]
        rows = [[e.source, e.target, e.type] + [_csv_value(e.props[k]) if k in e.props else "" for k in types]
                for e in edges]
        path = folder / f"rels_{etype}.csv"
        _write_csv(path, header, rows)
        written.append(path)
    args = [f"--nodes={p.name}" for p in written if p.name.startswith("nodes_")]
    args += [f"--relationships={p.name}" for p in written if p.name.startswith("rels_")]
    script = ("#!/bin/sh\n# Import these CSVs into a new Neo4j database (run from this folder; DB name 'neo4j').\n"
              "neo4j-admin database import full --overwrite-destination=true "
              f"--array-delimiter='{ARRAY_DELIMITER}' --multiline-fields=true \\\n  "
              + " \\\n  ".join(args) + " \\\n  neo4j\n")
    store.atomic_write_text(folder / "import.sh", script)
    written.append(folder / "import.sh")
    return written


# -- Cypher -----------------------------------------------------------------------------------------------
_CY_ESC = {"\\": "\\\\", "'": "\\'", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
           "\f": "\\f", "\x00": ""}
_CY_ESC_RE = re.compile("[\\\\'\"\n\r\t\b\f\x00]")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def cypher_string(value: str) -> str:
    return "'" + _CY_ESC_RE.sub(lambda m: _CY_ESC[m.group()], value) + "'"


def cypher_name(name: str) -> str:
    """A map key or property name: bare when it is a plain identifier, else back-quoted."""
    if _IDENT_RE.fullmatch(name):
        return name
    return "`" + name.replace("`", "``") + "`"


def cypher_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return cypher_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(cypher_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{cypher_name(str(k))}: {cypher_literal(v)}" for k, v in value.items()) + "}"
    return cypher_string(str(value))


def batch_rows(rows: list[str], max_rows: int, max_chars: int) -> list[list[str]]:
    """Consecutive groups of literal rows, bounded in count and in characters."""
    out: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for r in rows:
        if cur and (len(cur) >= max_rows or size + len(r) > max_chars):
            out.append(cur)
            cur, size = [], 0
        cur.append(r)
        size += len(r)
    if cur:
        out.append(cur)
    return out


def cypher_statements(graph: ExportGraph, max_rows: int = CYPHER_BATCH_ROWS,
                      max_chars: int = CYPHER_BATCH_CHARS) -> list[str]:
    """Index statements, then node batches (MERGE on id), then edge batches (MATCH both ends, MERGE)."""
    label_of = {n.id: n.label for n in graph.nodes}
    labels = list(NODE_LABELS) + sorted({n.label for n in graph.nodes} - set(NODE_LABELS))
    stmts = [f"CREATE INDEX FOR (n:{cypher_name(lb)}) ON (n.id)" for lb in labels]
    stmts.append("CREATE INDEX FOR (n:Entity) ON (n.name)")
    for label in labels:
        rows = [cypher_literal({"id": n.id, **n.props}) for n in graph.nodes if n.label == label]
        for batch in batch_rows(rows, max_rows, max_chars):
            stmts.append(f"UNWIND [{', '.join(batch)}] AS row MERGE (n:{cypher_name(label)} {{id: row.id}}) "
                         "SET n += row")
    groups: dict[tuple[str, str, str], list[Edge]] = {}
    for e in graph.edges:
        groups.setdefault((e.type, label_of[e.source], label_of[e.target]), []).append(e)
    for (etype, sl, tl), edges in groups.items():
        rows = [cypher_literal({"s": e.source, "t": e.target, "p": e.props}) for e in edges]
        for batch in batch_rows(rows, max_rows, max_chars):
            stmts.append(f"UNWIND [{', '.join(batch)}] AS row MATCH (a:{cypher_name(sl)} {{id: row.s}}) "
                         f"MATCH (b:{cypher_name(tl)} {{id: row.t}}) MERGE (a)-[r:{cypher_name(etype)}]->(b) "
                         "SET r += row.p")
    return stmts


def cypher_text(graph: ExportGraph) -> str:
    counts = graph.counts()
    head = (f"// hrag graph export: {counts['nodes']} nodes, {counts['edges']} edges.\n"
            "// One statement per line, each ending with ';'. Load into an empty graph (the CREATE INDEX lines\n"
            "// fail harmlessly when the index exists); the MERGE statements are safe to run again.\n")
    body = "".join(s + ";\n" for s in cypher_statements(graph))
    return head + body


def write_cypher(graph: ExportGraph, path: Path) -> list[Path]:
    store.atomic_write_text(path, cypher_text(graph))
    return [Path(path)]


def read_cypher_statements(text: str) -> list[str]:
    """Split a script written by write_cypher back into statements (comment lines skipped)."""
    return [line[:-1] for line in text.split("\n") if line and not line.startswith("//") and line.endswith(";")]


def publish(paths: list[Path]) -> list[Path]:
    """store's atomic writes already give ordinary file modes; the neo4j-admin import script also needs to be
    executable."""
    for p in paths:
        if p.suffix == ".sh":
            os.chmod(p, p.stat().st_mode | 0o111)
    return paths


WRITERS: dict[str, Callable[[ExportGraph, Path], list[Path]]] = {
    "graphml": write_graphml, "jsonl": write_jsonl, "csv": write_csv, "cypher": write_cypher,
}
# the single-file formats, as text: what `-o -` writes to stdout
TEXTS: dict[str, Callable[[ExportGraph], str]] = {"graphml": graphml_text, "cypher": cypher_text}

__all__ = ["ARRAY_DELIMITER", "SYMMETRIC_KINDS", "TEXTS", "WRITERS", "batch_rows", "cypher_literal", "cypher_statements",
           "cypher_text", "graphml_text", "read_cypher_statements", "write_csv", "write_cypher", "write_graphml", "write_jsonl", "xml_text"]

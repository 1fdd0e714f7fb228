"""`hrag export --format falkordb`: load the export graph into a running FalkorDB so it can serve the index.

What lands in the database (graph NAME):
- nodes Document, Chunk, Entity with the same ids and properties as every other export format, plus
  Fact nodes {id, key, subject, predicate, object, text, relation_id, source_ids} linked
  (f:Fact)-[:SUBJECT]->(:Entity) and (f)-[:OBJECT]->(:Entity); a fact is kept when both its entities are.
- edges PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, SYNONYM as in export.py.
- `embedding` vector properties (vecf32) on Entity, Chunk and Fact from vectors/{entities,chunks,facts},
  each with a cosine vector index, so `CALL db.idx.vector.queryNodes('Entity', 'embedding', k, vecf32($v))`
  works in the database alone (its score is the cosine distance, 0 = identical).
- range indexes on every label's `id` and on Entity `name`, created before loading so the edge loads find
  their endpoints by index; the vector indexes are built after the nodes are in (faster in bulk) with the
  project's [vectors] m / ef_construction / ef_search, and the load returns once every index is operational.
Re-running deletes graph NAME first and loads it again, so the result only depends on the project.
"""

from __future__ import annotations

import time
from typing import Any

from hrag_cli.core.config import VectorSettings
from hrag_cli.core.errors import HragError, UsageError
from hrag_cli.export.model import ExportGraph, Node, clean_value
from hrag_cli.export.formats import batch_rows, cypher_literal
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir

BATCH_ROWS = 500
BATCH_CHARS = 4_000_000          # parameters travel inside the query text; keep each query modest
REPLY_TIMEOUT = 1800.0           # seconds FalkorDB may take to answer one command
VECTOR_LABELS = {"Entity": "entities", "Chunk": "chunks", "Fact": "facts"}
_SCHEMES = ("redis://", "rediss://", "falkor://", "falkors://", "unix://")


def _vector_literal(vec: Any) -> str:
    """A float list for the CYPHER parameter header; 8 significant digits keep float32 vectors intact and
    printf-style formatting is several times faster than the client's str() per float."""
    values = vec.tolist() if hasattr(vec, "tolist") else list(vec)
    fmt = _VEC_FMT.get(len(values))
    if fmt is None:
        fmt = _VEC_FMT[len(values)] = ",".join(["%.8g"] * len(values))
    return "[" + (fmt % tuple(values)) + "]"


_VEC_FMT: dict[int, str] = {}


def connect(url: str) -> Any:
    """A connected FalkorDB client, or one clear line saying why not."""
    if not url.startswith(_SCHEMES):
        raise UsageError(f"--url {url!r}: expected redis://HOST:PORT (or rediss://, falkor://, unix://)")
    try:
        import redis
        from falkordb import FalkorDB
    except ImportError:
        raise UsageError("--format falkordb needs the FalkorDB client: pip install 'hrag[falkordb]'") from None
    try:
        # redis-py reuses the connect timeout for replies unless told otherwise; a big batch or an index
        # build can take minutes, so replies get their own generous limit
        db = FalkorDB.from_url(url, socket_connect_timeout=5, socket_timeout=REPLY_TIMEOUT)
        db.connection.ping()
    except (redis.exceptions.RedisError, OSError, ValueError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HragError(f"cannot reach FalkorDB at {url}: {msg}") from None
    return db


def _vectors(project: ProjectDir, name: str) -> tuple[dict[str, Any], int]:
    """id -> vector (a float32 row) from vectors/<name>, and the dimension; empty when never built."""
    from hrag_cli.storage.vectors.index import VectorIndex

    idx = VectorIndex.load(project.vectors_dir, name, VectorSettings())
    if idx is None or not len(idx):
        return {}, 0
    matrix = idx.vectors()
    return {i: matrix[p] for p, i in enumerate(idx.ids)}, idx.dim


def _fact_nodes(project: ProjectDir, graph: ExportGraph) -> tuple[list[Node], list[tuple[str, str, str]]]:
    """Fact nodes and their (fact id, SUBJECT|OBJECT, entity node id) links, for facts whose entities are in."""
    from hrag_cli.core import store
    from hrag_cli.core.normalize import normalize_name

    entity_ids = {n.id for n in graph.nodes if n.label == "Entity"}
    by_name: dict[str, str] = {}
    for n in graph.nodes:
        if n.label == "Entity" and isinstance(n.props.get("name"), str):
            by_name.setdefault(n.props["name"], n.id)

    def entity_of(name: str) -> str | None:
        nid = by_name.get(name)
        if nid is None:
            nid = "entity:" + normalize_name(name)
        return nid if nid in entity_ids else None

    nodes: list[Node] = []
    links: list[tuple[str, str, str]] = []
    for rec in store.read_jsonl(project.facts_path):
        if not isinstance(rec, dict) or "id" not in rec:
            continue
        s, o = entity_of(str(rec.get("subject", ""))), entity_of(str(rec.get("object", "")))
        if s is None or o is None:
            continue
        fid = "fact:" + str(rec["id"])
        raw = {"key": rec["id"], "subject": rec.get("subject"), "predicate": rec.get("predicate"),
               "object": rec.get("object"),
               "text": f"({rec.get('subject', '')}, {rec.get('predicate', '')}, {rec.get('object', '')})",
               "relation_id": rec.get("relation_id"), "source_ids": rec.get("source_ids") or []}
        props = {k: v for k, v in ((k, clean_value(v)) for k, v in raw.items()) if v is not None}
        nodes.append(Node(fid, "Fact", props))
        links.append((fid, "SUBJECT", s))
        links.append((fid, "OBJECT", o))
    return nodes, links


def _wait_for_indexes(g: Any, reporter: Reporter, poll: float = 0.1) -> None:
    """Block until every index of the graph reports OPERATIONAL (FalkorDB builds them in the background)."""
    t0 = time.monotonic()
    said = False
    while True:
        rows = g.query("CALL db.indexes() YIELD label, status RETURN label, status").result_set
        pending = sorted({lb for lb, status in rows if status != "OPERATIONAL"})
        if not pending:
            return
        if not said and time.monotonic() - t0 > 2:
            reporter.info(f"waiting for FalkorDB to build the indexes on {', '.join(pending)}")
            said = True
        time.sleep(poll)


def load_falkordb(project: ProjectDir, graph: ExportGraph, url: str, name: str, reporter: Reporter,
                  vector_settings: VectorSettings | None = None) -> dict:
    """Delete graph `name`, create indexes, load nodes with embeddings, then edges, then build the vector
    indexes (HNSW parameters from the project's [vectors] settings); returns counts."""
    db = connect(url)
    import redis
    vectors: dict[str, dict[str, Any]] = {}
    dims: dict[str, int] = {}
    for label, index_name in VECTOR_LABELS.items():
        vecs, dim = _vectors(project, index_name)
        prefix = {"Entity": "entity:", "Chunk": "chunk:", "Fact": "fact:"}[label]
        vectors[label] = {prefix + k: v for k, v in vecs.items()}
        dims[label] = dim
        if not vecs:
            reporter.warn(f"no vectors/{index_name} index (run 'hrag synonyms'): {label} nodes get no embedding")
    facts, fact_links = _fact_nodes(project, graph)
    nodes = graph.nodes + facts
    label_of = {n.id: n.label for n in nodes}
    labels = list(dict.fromkeys(["Document", "Chunk", "Entity", "Fact"] + [n.label for n in nodes]))
    # rows are Cypher map literals, sent as the CYPHER parameter header (what the client would build, faster;
    # cypher_literal escapes strings the way FalkorDB reads them and drops NUL, which its strings cannot hold)
    edge_groups: dict[tuple[str, str, str], list[str]] = {}
    for e in graph.edges:
        edge_groups.setdefault((e.type, label_of[e.source], label_of[e.target]), []).append(
            cypher_literal({"s": e.source, "t": e.target, "p": e.props}))
    for fid, etype, eid in fact_links:
        edge_groups.setdefault((etype, "Fact", "Entity"), []).append(cypher_literal({"s": fid, "t": eid, "p": {}}))
    total = len(nodes) + sum(len(v) for v in edge_groups.values())

    g = db.select_graph(name)
    stats = {"nodes": 0, "edges": 0, "vectors": 0}
    with_vectors: dict[str, int] = {}
    try:
        if name in db.list_graphs():
            g.delete()
        for label in labels:
            g.query(f"CREATE INDEX FOR (n:{label}) ON (n.id)")
        g.query("CREATE INDEX FOR (n:Entity) ON (n.name)")
        with reporter.task(f"falkordb {name}", total=total) as task:
            for label in labels:
                with_vec: list[str] = []
                plain: list[str] = []
                vecs = vectors.get(label, {})
                for n in nodes:
                    if n.label != label:
                        continue
                    props = cypher_literal({"id": n.id, **n.props})
                    v = vecs.get(n.id)
                    if v is not None:
                        with_vec.append(f"{{p: {props}, v: {_vector_literal(v)}}}")
                    else:
                        plain.append(f"{{p: {props}}}")
                for rows, query in ((plain, f"UNWIND $rows AS row CREATE (n:{label}) SET n = row.p"),
                                    (with_vec, f"UNWIND $rows AS row CREATE (n:{label}) "
                                               "SET n = row.p, n.embedding = vecf32(row.v)")):
                    for batch in batch_rows(rows, BATCH_ROWS, BATCH_CHARS):
                        g.query(f"CYPHER rows=[{', '.join(batch)}] {query}")
                        stats["nodes"] += len(batch)
                        task.advance(len(batch))
                stats["vectors"] += len(with_vec)
                with_vectors[label] = len(with_vec)
            for (etype, sl, tl), rows in edge_groups.items():
                query = (f"UNWIND $rows AS row MATCH (a:{sl} {{id: row.s}}) MATCH (b:{tl} {{id: row.t}}) "
                         f"CREATE (a)-[r:{etype}]->(b) SET r = row.p")
                for batch in batch_rows(rows, BATCH_ROWS, BATCH_CHARS):
                    res = g.query(f"CYPHER rows=[{', '.join(batch)}] {query}")
                    stats["edges"] += int(res.relationships_created)
                    task.advance(len(batch))
        # vector indexes after the load: one bulk build is faster than inserting node by node;
        # wait until they are operational so the database answers vector queries when this returns
        vs = vector_settings or VectorSettings()
        for label, dim in dims.items():
            if dim and with_vectors.get(label):
                g.query(f"CREATE VECTOR INDEX FOR (n:{label}) ON (n.embedding) OPTIONS {{dimension: {int(dim)}, "
                        f"similarityFunction: 'cosine', M: {int(vs.m)}, efConstruction: {int(vs.ef_construction)}, "
                        f"efRuntime: {int(vs.ef_search)}}}")
        _wait_for_indexes(g, reporter)
    except redis.exceptions.ConnectionError as exc:
        raise HragError(f"lost the connection to FalkorDB at {url}: {str(exc).splitlines()[0]}") from None
    except redis.exceptions.ResponseError as exc:
        msg = str(exc).splitlines()[0]
        hint = " (is the FalkorDB module loaded in that server?)" if "unknown command" in msg.lower() else ""
        raise HragError(f"FalkorDB refused the load into graph {name!r}: {msg}{hint}") from None
    finally:
        try:
            db.close()
        except Exception:
            pass
    expected_edges = sum(len(v) for v in edge_groups.values())
    if stats["edges"] != expected_edges:
        reporter.warn(f"FalkorDB created {stats['edges']} of {expected_edges} edges (missing endpoints)")
    by_label: dict[str, int] = {}
    for n in nodes:
        by_label[n.label] = by_label.get(n.label, 0) + 1
    by_type: dict[str, int] = {}
    for (etype, _, _), rows in edge_groups.items():
        by_type[etype] = by_type.get(etype, 0) + len(rows)
    return {"url": url, "graph": name, "nodes": stats["nodes"], "edges": stats["edges"],
            "facts": len(facts), "vectors": stats["vectors"], "labels": by_label, "types": by_type}

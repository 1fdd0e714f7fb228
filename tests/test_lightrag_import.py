"""`hrag index --import-lightrag DIR`: a LightRAG working directory becomes a project with no LLM call.

The working directories are written here to LightRAG's formats as real ones hold them: the older nested
response cache (`{"default": {hash: {...}}}`, answers that name no chunk, a gleaning prompt that carries the
earlier turns as a JSON list) with the legacy tuple answers and quoted upper-case graph ids, and the newer flat
cache (`"default:extract:hash"` with `chunk_id`) with `<|#|>` answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import escape

from hrag_cli.chunk.stage import load_chunks
from hrag_cli.core import store
from hrag_cli.core.project import ProjectDir
from tests.test_index_e2e import _one_line_error, run, summary

PROMPT = ("-Goal-\nGiven a text document, identify all entities and relationships.\n-Real Data-\n"
          "######################\nEntity_types: person,organization,geo\nText: {text}\n"
          "######################\nOutput:\n")
CONTINUE = "MANY entities were missed in the last extraction.  Add them below using the same format:\n"
DOC = ("Mara Quint founded the Harbour Trust in Oldport. The Trust restored the Selby Lighthouse.\n\n"
       "Tobiah Renn, an engineer from Calder, rebuilt the lighthouse lamp for Mara Quint.")
CHUNKS = ["Mara Quint founded the Harbour Trust in Oldport. The Trust restored the Selby Lighthouse.\n\n",
          "Tobiah Renn, an engineer from Calder, rebuilt the lighthouse lamp for Mara Quint."]


def _graphml(nodes: list[tuple[str, str, str]], edges: list[tuple[str, str, str, str]]) -> str:
    """nodes: (id, type, source chunk ids joined by <SEP>); edges: (source, target, keywords, source ids)."""
    out = ['<?xml version=\'1.0\' encoding=\'utf-8\'?>\n<graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
           '<key id="d5" for="edge" attr.name="source_id" attr.type="string"/>'
           '<key id="d4" for="edge" attr.name="keywords" attr.type="string"/>'
           '<key id="d3" for="edge" attr.name="description" attr.type="string"/>'
           '<key id="d6" for="edge" attr.name="weight" attr.type="double"/>'
           '<key id="d2" for="node" attr.name="source_id" attr.type="string"/>'
           '<key id="d1" for="node" attr.name="description" attr.type="string"/>'
           '<key id="d0" for="node" attr.name="entity_type" attr.type="string"/>'
           '<graph edgedefault="undirected">']
    for nid, typ, src in nodes:
        out.append(f'<node id="{nid}"><data key="d0">{typ}</data><data key="d1">about {nid}</data>'
                   f'<data key="d2">{escape(src)}</data></node>')
    for s, t, kw, src in edges:
        out.append(f'<edge source="{s}" target="{t}"><data key="d6">7.0</data><data key="d3">{s} and {t}</data>'
                   f'<data key="d4">{kw}</data><data key="d5">{escape(src)}</data></edge>')
    return "\n".join(out) + "</graph></graphml>\n"


def _stores(wd: Path, chunks: list[str], doc: str) -> list[str]:
    wd.mkdir()
    ids = [f"chunk-{i:032x}" for i in range(len(chunks))]
    (wd / "kv_store_full_docs.json").write_text(json.dumps({"doc-1": {"content": doc}}))
    (wd / "kv_store_text_chunks.json").write_text(json.dumps(
        {cid: {"tokens": len(text.split()), "content": text, "chunk_order_index": i, "full_doc_id": "doc-1"}
         for i, (cid, text) in enumerate(zip(ids, chunks))}))
    return ids


def old_workdir(tmp_path: Path) -> Path:
    """Nested cache; each chunk answered once and gleaned once; the graph holds what LightRAG merged."""
    wd = tmp_path / "old"
    ids = _stores(wd, CHUNKS, DOC)
    first = ['("entity"<|>"Mara Quint"<|>"person"<|>"Founder of the Harbour Trust.")##\n'
             '("entity"<|>"Harbour Trust"<|>"organization"<|>"A trust in Oldport.")##\n'
             '("relationship"<|>"Mara Quint"<|>"Harbour Trust"<|>"Mara Quint founded it."<|>"founded"<|>9)##\n'
             '("content_keywords"<|>"lighthouse")<|COMPLETE|>',
             '("entity"<|>"Tobiah Renn"<|>"person"<|>"An engineer from Calder.")##\n'
             '("entity"<|>"Mara Quint"<|>"person"<|>"Client of Tobiah Renn.")##\n'
             '("relationship"<|>"Tobiah Renn"<|>"Mara Quint"<|>"He rebuilt her lamp."<|>"worked for"<|>6)'
             '<|COMPLETE|>']
    glean = ['("entity"<|>"Selby Lighthouse"<|>"geo"<|>"A lighthouse restored by the Trust.")##\n'
             '("relationship"<|>"Harbour Trust"<|>"Selby Lighthouse"<|>"It restored it."<|>"restored"<|>8)'
             '<|COMPLETE|>',
             '("entity"<|>"Calder"<|>"geo"<|>"Home town of Tobiah Renn.")<|COMPLETE|>']
    default = {}
    for i, text in enumerate(CHUNKS):
        prompt = PROMPT.format(text=text)
        default[f"{i}a"] = {"return": first[i], "cache_type": "extract", "embedding": None, "original_prompt": prompt}
        history = json.dumps([{"role": "user", "content": prompt}, {"role": "assistant", "content": first[i]}])
        default[f"{i}b"] = {"return": glean[i], "cache_type": "extract", "embedding": None,
                            "original_prompt": history + "\n" + CONTINUE}
    cache = {"default": default, "naive": {"q1": {"return": "An answer.", "cache_type": "query",
                                                  "original_prompt": "Who founded the Harbour Trust?"}}}
    (wd / "kv_store_llm_response_cache.json").write_text(json.dumps(cache))
    a, b = ids
    nodes = [("&quot;MARA QUINT&quot;", '"PERSON"', f"{a}<SEP>{b}"), ("&quot;HARBOUR TRUST&quot;", '"ORGANIZATION"', a),
             ("&quot;SELBY LIGHTHOUSE&quot;", '"GEO"', a), ("&quot;TOBIAH RENN&quot;", '"PERSON"', b),
             ("&quot;CALDER&quot;", '"GEO"', b)]
    edges = [("&quot;MARA QUINT&quot;", "&quot;HARBOUR TRUST&quot;", '"founded"', a),
             ("&quot;HARBOUR TRUST&quot;", "&quot;SELBY LIGHTHOUSE&quot;", '"restored"', a),
             ("&quot;TOBIAH RENN&quot;", "&quot;MARA QUINT&quot;", '"worked for"', b)]
    (wd / "graph_chunk_entity_relation.graphml").write_text(_graphml(nodes, edges))
    return wd


def new_workdir(tmp_path: Path) -> Path:
    """Flat cache naming each answer's chunk; the third chunk's answer is missing, so its rows come from the
    graph."""
    wd = tmp_path / "new"
    third = "Ilse Varga keeps the Oldport museum."
    ids = _stores(wd, [*CHUNKS, third], DOC + "\n\n" + third)
    answers = ["entity<|#|>Mara Quint<|#|>person<|#|>Founder of the Harbour Trust.\n"
               "entity<|#|>Harbour Trust<|#|>organization<|#|>A trust in Oldport.\n"
               "relation<|#|>Mara Quint<|#|>Harbour Trust<|#|>founded<|#|>Mara Quint founded it.\n<|COMPLETE|>",
               "entity<|#|>Tobiah Renn<|#|>person<|#|>An engineer from Calder.\n"
               "entity<|#|>Calder<|#|>location<|#|>A town.\n"
               "relation<|#|>Tobiah Renn<|#|>Calder<|#|>comes from<|#|>He is from Calder.\n<|COMPLETE|>"]
    cache = {f"default:extract:{i:032x}": {"return": ans, "cache_type": "extract", "chunk_id": ids[i],
                                           "original_prompt": PROMPT.format(text=CHUNKS[i]), "queryparam": None}
             for i, ans in enumerate(answers)}
    cache["mix:query:ff"] = {"return": "An answer.", "cache_type": "query", "chunk_id": None,
                             "original_prompt": "Who keeps the museum?"}
    (wd / "kv_store_llm_response_cache.json").write_text(json.dumps(cache))
    nodes = [("Ilse Varga", "person", ids[2]), ("Oldport Museum", "organization", ids[2])]
    edges = [("Ilse Varga", "Oldport Museum", "keeps,curator", ids[2])]
    (wd / "graph_chunk_entity_relation.graphml").write_text(_graphml(nodes, edges))
    return wd


def _index(wd: Path | None, proj: Path, stub=None):
    """With `stub`: an LLM is configured (the stub server), so a request would be counted."""
    model = ["--llm-model", "openai/stub-model", "--llm-api-base", stub.url] if stub is not None else []
    args = ["index", "-p", str(proj), *model, "--json", *(["--import-lightrag", str(wd)] if wd else [])]
    proc = run(args, inprocess=True)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_old_cache_matched_by_text_gleanings_merged_no_request(tmp_path: Path, stub) -> None:
    proj = tmp_path / "proj"
    out = summary(_index(old_workdir(tmp_path), proj, stub))
    assert stub.count() == 0 and stub.count("/v1/embeddings") == 0
    chunks = load_chunks(ProjectDir(proj))
    assert [c.text for c in chunks] == CHUNKS and [c.order for c in chunks] == [0, 1]
    ex = out["extract"]
    assert (ex["lightrag_matched_by_text"], ex["lightrag_from_answers"], ex["llm_requests"]) == (4, 2, 0)
    # the graph file's 5 entities and 3 edges, each one found again (a gleaning's rows included)
    assert (ex["lightrag_graphml_entities"], ex["lightrag_graphml_relations"]) == (5, 3)
    assert (out["resolve"]["entities"], out["resolve"]["relations"]) == (5, 3)
    recs = [r for r in store.read_jsonl(proj / "cache" / "extractions.jsonl")]
    assert {r["gleaning_rounds"] for r in recs} == {1}
    assert "Selby Lighthouse" in {e["name"] for r in recs for e in r["entities"]}


def test_new_cache_by_chunk_id_graph_fallback_and_plain_rerun(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    wd = new_workdir(tmp_path)
    out = summary(_index(wd, proj))
    ex = out["extract"]
    assert (ex["lightrag_matched_by_id"], ex["lightrag_from_answers"], ex["lightrag_from_graph"]) == (2, 2, 1)
    assert (out["resolve"]["entities"], out["resolve"]["relations"]) == (6, 3)
    # a plain `hrag index` imports the same directory again: nothing changes
    again = summary(_index(None, proj))
    assert again["extract"]["extractor"] == ex["extractor"] and again["extract"]["llm_requests"] == 0
    assert again["resolve"] == "fresh"
    q = run(["query", "Who keeps the Oldport museum?", "--mode", "ppr", "-p", str(proj), "--json"], inprocess=True)
    assert q.returncode == 0, q.stderr
    assert "Ilse Varga keeps the Oldport museum." in q.stdout


def test_bad_import_inputs_are_one_line_errors(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    _one_line_error(run(["index", "-p", str(proj), "--import-lightrag", str(tmp_path / "nope")], inprocess=True), 2,
                    "--import-lightrag", "not a directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(run(["index", "-p", str(proj), "--import-lightrag", str(empty)], inprocess=True), 2,
                    "kv_store_full_docs.json")
    wd = new_workdir(tmp_path)
    (wd / "kv_store_llm_response_cache.json").write_text("{not json")
    _one_line_error(run(["index", "-p", str(proj), "--import-lightrag", str(wd)], inprocess=True), 2, "not valid JSON")
    _one_line_error(run(["index", str(tmp_path), "-p", str(proj), "--import-lightrag", str(wd)], inprocess=True), 2, "not both")
    assert not proj.exists()

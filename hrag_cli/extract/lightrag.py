"""Import a LightRAG working directory: its documents and chunks as this project's, its cached extraction answers
as extraction records, calling no LLM.

Why: a LightRAG user has paid for those extractions; importing them lets PPR and every hrag mode run on them.
What is read (all JSON but the graph):
- kv_store_full_docs.json `{doc_id: {"content", "file_path"?}}` and kv_store_text_chunks.json `{chunk_id:
  {"content", "full_doc_id", "chunk_order_index", "tokens"}}`: one LightRAG chunk becomes one chunk here, in its
  order within its document.
- kv_store_llm_response_cache.json, flat `{"default:extract:<hash>": {"return", "cache_type", "chunk_id",
  "original_prompt"}}` or the older nested `{"default": {<hash>: {...}}}` whose entries name no chunk: an answer
  is then matched to the chunk whose text its prompt holds. A gleaning answer's prompt carries the earlier turns
  as a JSON list of messages (older caches) or names only the chunk id; it is merged into the chunk's first answer
  as hrag merges its own gleaning rounds. Answers go through hrag's parser, which reads LightRAG's formats.
- graph_chunk_entity_relation.graphml: a chunk no answer could be matched to takes the graph's entities and
  edges whose `source_id` names it; the graph's node and edge counts are kept to compare with hrag's.
"""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import fingerprint
from hrag_cli.core.records import Chunk, ExtractedEntity, ExtractedRelation, ExtractionRecord
from hrag_cli.extract.imported import ForeignDoc, ImportedCorpus, build_corpus
from hrag_cli.extract.parser import (DEFAULT_PREDICATE, PARSER_VERSION, UNKNOWN_TYPE, ParseResult, clean_name,
                                     clean_type, merge_gleaning, parse_extraction)

__all__ = ["EXTRACTOR_PREFIX", "check_dir", "import_records", "read_corpus"]

IMPORT_VERSION = "lightrag-import-v1"
EXTRACTOR_PREFIX = "lightrag:"
DOCS_FILE = "kv_store_full_docs.json"
CHUNKS_FILE = "kv_store_text_chunks.json"
CACHE_FILE = "kv_store_llm_response_cache.json"
GRAPH_FILE = "graph_chunk_entity_relation.graphml"
GRAPH_SEP = "<SEP>"          # LightRAG joins merged descriptions and source ids with it
_WS = re.compile(r"\s+")
_KEY_CHARS = 48              # a chunk is looked for in a prompt by its first this many (whitespace-folded) chars


def _fold(text: str) -> str:
    return _WS.sub(" ", text).strip()


def check_dir(path: Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_dir():
        raise UsageError(f"--import-lightrag: {path} is not a directory (give a LightRAG working directory)")
    missing = [n for n in (DOCS_FILE, CHUNKS_FILE) if not (path / n).is_file()]
    if missing:
        raise UsageError(f"--import-lightrag: {path} has no {' or '.join(missing)} "
                         "(not a LightRAG working directory, or one that has indexed nothing)")
    return path.resolve()


def _load(path: Path, default: Any = None) -> Any:
    if not path.is_file():
        if default is not None:
            return default
        raise UsageError(f"--import-lightrag: {path} does not exist")
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"--import-lightrag: {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--import-lightrag: {path} is not a JSON object (expected LightRAG's key-value store)")
    return data


def importer_id(path: Path) -> str:
    """The `extractor` of imported records: changes when the cache, the graph or this importer does."""
    h = hashlib.sha256()
    for name in (CHUNKS_FILE, CACHE_FILE, GRAPH_FILE):
        f = path / name
        h.update(f.read_bytes() if f.is_file() else b"")
    return f"{EXTRACTOR_PREFIX}{fingerprint(IMPORT_VERSION, h.hexdigest())}"


def read_corpus(path: Path) -> ImportedCorpus:
    """Documents and chunks: documents in LightRAG's id order, each one's chunks in `chunk_order_index` order."""
    docs = _load(path / DOCS_FILE)
    raw_chunks = _load(path / CHUNKS_FILE)
    by_doc: dict[str, list[tuple[int, str, dict]]] = defaultdict(list)
    skipped = 0
    for cid, ch in raw_chunks.items():
        if not isinstance(ch, dict) or not isinstance(ch.get("content"), str) or not ch["content"].strip():
            skipped += 1
            continue
        order = ch.get("chunk_order_index")
        by_doc[str(ch.get("full_doc_id", ""))].append((order if isinstance(order, int) else 0, cid, ch))
    foreign = []
    for key in sorted(by_doc):
        meta = docs.get(key) if isinstance(docs.get(key), dict) else {}
        src = meta.get("file_path")
        parts = sorted(by_doc[key], key=lambda p: (p[0], p[1]))
        foreign.append(ForeignDoc(key, src if isinstance(src, str) and src != "unknown_source" else "",
                                  meta.get("content") if isinstance(meta.get("content"), str) else "",
                                  [(cid, ch["content"], ch.get("tokens")) for _, cid, ch in parts]))
    corpus = build_corpus(foreign)
    corpus.counts["skipped_chunks"] = skipped
    return corpus


# ------------------------------------------------------------------------------------------- the cache


def _entries(cache: dict) -> list[dict]:
    """The extraction entries of either cache layout."""
    out: list[dict] = []
    for key, val in cache.items():
        if not isinstance(val, dict):
            continue
        if "return" in val:                       # flat: "mode:cache_type:hash"
            out.append(val)
        else:                                     # nested: mode -> hash -> entry
            out.extend(e for e in val.values() if isinstance(e, dict) and "return" in e)
    return [e for e in out if e.get("cache_type") == "extract" and isinstance(e.get("return"), str)]


def _split_prompt(prompt: Any) -> tuple[str, str]:
    """(earlier turns' text, this turn's prompt): older caches store a gleaning prompt as the JSON list of the
    earlier messages followed by the new one."""
    if not isinstance(prompt, str):
        return "", ""
    s = prompt.lstrip()
    if s.startswith("["):
        try:
            history, end = json.JSONDecoder().raw_decode(s)
        except ValueError:
            return "", prompt
        if isinstance(history, list):
            turns = " ".join(m.get("content", "") for m in history if isinstance(m, dict)
                             and isinstance(m.get("content"), str))
            return turns, s[end:]
    return "", prompt


class _TextFinder:
    """Which chunk's text a prompt holds: a slide over the prompt looking up each window of _KEY_CHARS folded
    chars among the chunks' first ones, then the whole folded text checked (linear in the prompt's length)."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.folded = {ch.chunk_id: _fold(ch.text) for ch in chunks}
        self.heads: dict[str, list[str]] = defaultdict(list)
        for cid, text in self.folded.items():
            self.heads[text[:_KEY_CHARS]].append(cid)
        self.short = {len(h) for h in self.heads if len(h) < _KEY_CHARS}

    def find(self, prompt: str) -> str | None:
        text = _fold(prompt)
        best: str | None = None
        for size in sorted({_KEY_CHARS} | self.short, reverse=True):
            for i in range(max(0, len(text) - size + 1)):
                for cid in self.heads.get(text[i:i + size], ()):
                    body = self.folded[cid]
                    if text.startswith(body, i) and (best is None or len(body) > len(self.folded[best])):
                        best = cid
            if best is not None:
                return best
        return None


def _answers(path: Path, corpus: ImportedCorpus, counts: dict[str, int]) -> dict[str, list[str]]:
    """chunk id here -> its answers, the first answer before the gleaning rounds."""
    cache = _load(path / CACHE_FILE, default={})
    entries = _entries(cache)
    counts["cache_answers"] = len(entries)
    finder: _TextFinder | None = None
    folded = {ch.chunk_id: _fold(ch.text) for ch in corpus.chunks}
    ranked: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for n, e in enumerate(entries):
        history, current = _split_prompt(e.get("original_prompt"))
        cid = corpus.ids.get(e.get("chunk_id")) if isinstance(e.get("chunk_id"), str) else None
        if cid is not None:
            counts["matched_by_id"] += 1
        else:
            finder = finder or _TextFinder(corpus.chunks)
            cid = finder.find(current) or (finder.find(history) if history else None)
            if cid is None:
                counts["unmatched_answers"] += 1
                continue
            counts["matched_by_text"] += 1
        # a chunk's first answer was asked with its text; a gleaning round's prompt holds only earlier turns
        first = not history and folded[cid] in _fold(current)
        ranked[cid].append((0 if first else 1, len(history) or n, e["return"]))
    return {cid: [a for _, _, a in sorted(items)] for cid, items in ranked.items()}


# ------------------------------------------------------------------------------------------- the graph


def _unquote(s: str) -> str:
    s = s.strip()
    return s[1:-1].strip() if len(s) >= 2 and s[0] == s[-1] == '"' else s


def read_graph(path: Path) -> tuple[dict[str, ExtractionRecord], dict[str, int]]:
    """LightRAG chunk id -> the graph's entities and edges that name it; and the graph's own counts."""
    f = path / GRAPH_FILE
    if not f.is_file():
        return {}, {"graphml_entities": 0, "graphml_relations": 0}
    try:
        root = ET.parse(f).getroot()
    except ET.ParseError as exc:
        raise UsageError(f"--import-lightrag: {f} is not valid GraphML ({exc})") from None
    ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    names = {k.get("id"): k.get("attr.name") for k in root.iter(f"{ns}key")}

    def data(el: ET.Element) -> dict[str, str]:
        return {names.get(d.get("key"), d.get("key")): d.text or "" for d in el.findall(f"{ns}data")}

    per: dict[str, ExtractionRecord] = {}

    def rec(lr_chunk: str) -> ExtractionRecord:
        return per.setdefault(lr_chunk, ExtractionRecord(chunk_id=lr_chunk, extractor="", entities=[],
                                                         relations=[]))

    nodes = edges = 0
    for node in root.iter(f"{ns}node"):
        nodes += 1
        d = data(node)
        name = clean_name(_unquote(d.get("entity_id") or node.get("id", "")))
        if not name:
            continue
        etype = clean_type(_unquote(d.get("entity_type", ""))) or UNKNOWN_TYPE
        desc = _unquote(d.get("description", "").split(GRAPH_SEP)[0])
        for src in d.get("source_id", "").split(GRAPH_SEP):
            if src.strip():
                rec(src.strip()).entities.append(ExtractedEntity(name=name, type=etype, description=desc))
    for edge in root.iter(f"{ns}edge"):
        edges += 1
        d = data(edge)
        s, t = clean_name(_unquote(edge.get("source", ""))), clean_name(_unquote(edge.get("target", "")))
        if not s or not t:
            continue
        keywords = [k.strip() for k in _unquote(d.get("keywords", "")).replace(GRAPH_SEP, ",").split(",")
                    if k.strip()]
        try:
            weight = float(d.get("weight", "1") or 1)
        except ValueError:
            weight = 1.0
        desc = _unquote(d.get("description", "").split(GRAPH_SEP)[0])
        for src in d.get("source_id", "").split(GRAPH_SEP):
            if src.strip():
                rec(src.strip()).relations.append(ExtractedRelation(
                    src=s, tgt=t, predicate=keywords[0] if keywords else DEFAULT_PREDICATE, keywords=keywords,
                    description=desc, strength=weight))
    return per, {"graphml_entities": nodes, "graphml_relations": edges}


# ------------------------------------------------------------------------------------------- records


def import_records(path: Path, corpus: ImportedCorpus,
                   reporter: Reporter | None = None) -> tuple[str, list[ExtractionRecord], dict[str, Any]]:
    """(extractor id, one record per chunk that has answers or graph rows, counts)."""
    extractor = importer_id(path)
    counts: dict[str, Any] = {"cache_answers": 0, "matched_by_id": 0, "matched_by_text": 0, "unmatched_answers": 0,
                              "from_answers": 0, "from_graph": 0, "without_extraction": 0}
    answers = _answers(path, corpus, counts)
    graph, graph_counts = read_graph(path)
    counts.update(graph_counts)
    back = {cid: lr for lr, cid in corpus.ids.items()}
    records: list[ExtractionRecord] = []
    for ch in corpus.chunks:
        texts = answers.get(ch.chunk_id)
        if texts:
            res: ParseResult = parse_extraction(texts[0])
            for more in texts[1:]:
                res = merge_gleaning(res, parse_extraction(more))
            counts["from_answers"] += 1
            records.append(ExtractionRecord(chunk_id=ch.chunk_id, extractor=extractor, entities=res.entities,
                                            relations=res.relations, gleaning_rounds=len(texts) - 1,
                                            dropped_rows=res.n_dropped, dropped=dict(res.dropped),
                                            parser=PARSER_VERSION))
            continue
        rows = graph.get(back[ch.chunk_id])
        if rows is None:
            counts["without_extraction"] += 1
            continue
        counts["from_graph"] += 1
        records.append(ExtractionRecord(chunk_id=ch.chunk_id, extractor=extractor, entities=rows.entities,
                                        relations=rows.relations))
    if reporter is not None:
        reporter.info(f"lightrag import: {len(corpus.chunks)} chunks, {counts['from_answers']} from cached answers "
                      f"({counts['matched_by_id']} answers matched by chunk id, {counts['matched_by_text']} by "
                      f"text), {counts['from_graph']} from the graph file")
        if counts["unmatched_answers"]:
            reporter.warn(f"lightrag import: {counts['unmatched_answers']} cached extraction answers match no chunk "
                          "of the working directory (left out)")
        if counts["without_extraction"]:
            reporter.warn(f"lightrag import: {counts['without_extraction']} chunks have neither a cached answer "
                          "nor graph rows: they are indexed without entities")
    return extractor, records, counts

"""`hrag eval QA.jsonl`: Recall@k of retrieval modes against gold passages.

QA file: one JSON object a line, `question` (or `query`), optional `id`, and the gold passages under
`gold_docs`, `gold`, `gold_passages` or `gold_chunks`: a list whose items are a document path (relative, as
`hrag query` prints it; a trailing-path match is accepted, so `people/x.txt` finds `corpus/people/x.txt`), a
chunk id, the exact passage text (whitespace-insensitive; a chunk that contains it counts) or a passage title
(the first line of the chunk), or objects `{"title", "text"}`. MuSiQue-style `paragraphs` with
`is_supporting` work as well.

Recall@k = the fraction of a question's gold passages found among its top k chunks, averaged over questions
(HippoRAG's metric). `--json` prints
`{"questions": n, "k": [2, 5], "unresolved_gold": n, "modes": {MODE: {"recall": {"2": 0.5, "5": 0.7},
"ms_per_query": 12.3}}}` with recall as a fraction.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir

_WS = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold()


@dataclass
class QAItem:
    id: str
    question: str
    gold: list[str]


def _gold_of(rec: dict) -> list[str]:
    for key in ("gold_docs", "gold", "gold_passages", "gold_chunks", "supporting_passages"):
        val = rec.get(key)
        if isinstance(val, list):
            out: list[str] = []
            for g in val:
                if isinstance(g, str) and g.strip():
                    out.append(g.strip())
                elif isinstance(g, dict):
                    text = g.get("text") or g.get("paragraph_text")
                    title = g.get("title")
                    if isinstance(text, str) and text.strip():
                        out.append(text.strip())
                    elif isinstance(title, str) and title.strip():
                        out.append(title.strip())
            return out
    paras = rec.get("paragraphs")
    if isinstance(paras, list):
        return [p.get("paragraph_text") or p.get("text") for p in paras
                if isinstance(p, dict) and p.get("is_supporting") and (p.get("paragraph_text") or p.get("text"))]
    return []


def load_qa(path: Path) -> list[QAItem]:
    lines = store.read_input_text(path, "QA file").splitlines()
    items: list[QAItem] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = store.loads(line)
        except Exception:
            raise UsageError(f"{path}, line {n}: not valid JSON") from None
        if not isinstance(rec, dict):
            raise UsageError(f"{path}, line {n}: expected a JSON object")
        q = rec.get("question", rec.get("query"))
        if not isinstance(q, str) or not q.strip():
            raise UsageError(f"{path}, line {n}: needs a non-empty \"question\"")
        gold = _gold_of(rec)
        if not gold:
            raise UsageError(f"{path}, line {n}: no gold passages (gold_docs, gold, gold_passages or gold_chunks)")
        items.append(QAItem(str(rec.get("id", n)), q.strip(), gold))
    if not items:
        raise UsageError(f"{path} has no questions")
    return items


class GoldResolver:
    """Turns each gold reference into the set of chunk ids that count as finding it."""

    def __init__(self, chunks: dict[str, Any], docs: dict[str, Any]) -> None:
        self.chunk_ids = set(chunks)
        self.by_doc: dict[str, set[str]] = {}
        self.by_text: dict[str, set[str]] = {}
        self.by_first_line: dict[str, set[str]] = {}
        self.norm_text: list[tuple[str, str]] = []
        for cid, c in chunks.items():
            self.by_doc.setdefault(c.doc_id, set()).add(cid)
            nt = _norm(c.text)
            self.by_text.setdefault(nt, set()).add(cid)
            self.norm_text.append((cid, nt))
            first = next((ln for ln in c.text.splitlines() if ln.strip()), "")
            self.by_first_line.setdefault(_norm(first), set()).add(cid)
        self.paths = {d.path: d.doc_id for d in docs.values()}

    def resolve(self, gold: str) -> set[str]:
        if gold in self.paths:
            return set(self.by_doc.get(self.paths[gold], ()))
        suffix = [doc_id for path, doc_id in self.paths.items() if path.endswith("/" + gold)]
        if suffix:
            return set().union(*(self.by_doc.get(d, set()) for d in suffix))
        if gold in self.chunk_ids:
            return {gold}
        g = _norm(gold)
        if g in self.by_text:
            return set(self.by_text[g])
        if g in self.by_first_line:
            return set(self.by_first_line[g])
        if len(g) >= 20:
            return {cid for cid, nt in self.norm_text if g in nt}
        return set()


def evaluate(project: ProjectDir, settings: Settings, items: list[QAItem], modes: list[str], ks: list[int],
             reporter: Reporter | None = None) -> dict:
    from hrag_cli.query.run import QuerySession

    session = QuerySession(project, replace(settings, query=replace(settings.query, top_k=max(ks))))
    ix = session.index
    resolver = GoldResolver(ix.chunks, ix.docs)
    targets = [[resolver.resolve(g) for g in item.gold] for item in items]
    unresolved = sum(1 for ts in targets for t in ts if not t)
    if unresolved and reporter is not None:
        reporter.warn(f"{unresolved} gold passages match no chunk of this project; they count as misses")
    out: dict[str, Any] = {"questions": len(items), "k": ks, "unresolved_gold": unresolved, "modes": {}}
    try:
        for mode in modes:
            sums = {k: 0.0 for k in ks}
            t0 = time.perf_counter()
            for item, ts in zip(items, targets):
                r, _ = session.run(item.question, mode=mode)
                ranked = [c.chunk_id for c in r.chunks]
                for k in ks:
                    top = set(ranked[:k])
                    sums[k] += sum(1 for t in ts if t & top) / len(ts)
            secs = time.perf_counter() - t0
            out["modes"][mode] = {"recall": {str(k): round(sums[k] / len(items), 4) for k in ks},
                                  "ms_per_query": round(1000 * secs / len(items), 2)}
    finally:
        session.close()
    return out


def parse_list(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise UsageError(f"{what}: give a comma-separated list")
    return items

"""`hrag query`: one question (a table, `--json`, `--context` or `--answer`) or a batch file (one JSON line per
query), over the index as it is; nothing is rebuilt.

`--json` / batch line schema (one object per query):

    {
      "id": "q1",                      # batch only: the JSONL `id`, else the 1-based line number as a string
      "query": "...", "mode": "ppr",
      "chunks": [{"rank": 1, "chunk_id": "...", "doc_id": "...", "path": "guide/deps.md",
                  "score": 0.0123, "text": "...",
                  "section": ["Dependencies", "With yield"],  # heading trail ([] when none)
                  "page": 0,                                  # PDF page the chunk starts on (0: not a PDF)
                  "page_end": 0,                              # PDF page it ends on, when a later one
                  "where": "guide/deps.md › Dependencies › With yield"}],   # or "manual.pdf pp. 12-13"
                                                            # best first, at most --top-k, token-budgeted
      "entities": [{"id", "name", "type", "description", "score", ...}],   # ppr: seed entities (+ seeded_by)
      "relations": [{"id", "src", "tgt", "predicates", "keywords", "description", "weight", "score", ...}],
                                                            # + rel_type when the relation has a schema type
      "facts": [{"id", "subject", "predicate", "object", "score"}],          # ppr: the facts that seeded it
      "keywords": {"high": [...], "low": [...]},            # LightRAG modes only, else {}
      "notes": ["..."],                                     # e.g. the dense fallback of ppr
      "timings": {"embed_ms", "bm25_ms", "seed_ms", "fact_filter_ms", "ppr_ms", "keywords_ms", "rerank_ms",
                  "retrieve_ms", "total_ms"},
      "context": "...",                                     # with --context
      "answer": "...", "citations": [{"n": 1, "chunk_id": "...", "path": "...", "section": [...], "page": 0,
                                      "where": "..."}]   # with --answer
    }

Timings present depend on the mode; `total_ms` includes loading whatever this query was the first to need.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.query.context import build_context, relation_arrow
from hrag_cli.query.index import QueryIndex
from hrag_cli.query.retrieval import retrieve
from hrag_cli.query.types import Retrieval

_CITE = re.compile(r"\[(\d+)\]")


def read_queries(path: Path) -> list[tuple[str, str]]:
    """(id, query) from a text file (one query per line) or JSONL ({id, query}); blank lines are skipped."""
    raw = store.read_input_text(path, "--file")
    out: list[tuple[str, str]] = []
    for n, line in enumerate(raw.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                rec = store.loads(line)
            except Exception:
                raise UsageError(f"--file {path}, line {n}: not valid JSON") from None
            q = rec.get("query", rec.get("question")) if isinstance(rec, dict) else None
            if not isinstance(q, str) or not q.strip():
                raise UsageError(f"--file {path}, line {n}: needs a non-empty \"query\"")
            out.append((str(rec.get("id", n)), q.strip()))
        else:
            out.append((str(n), line))
    if not out:
        raise UsageError(f"--file: {path} has no queries")
    return out


def read_history(path: Path) -> list[dict]:
    """Earlier turns of a conversation for `--answer`: a JSON list, or JSONL, of {"role": "user" | "assistant",
    "content": "..."} in the order they were said."""
    raw = store.read_input_text(path, "--history").strip()
    if not raw:
        return []
    try:
        turns = store.loads(raw) if raw.startswith("[") else [store.loads(line) for line in raw.splitlines()
                                                              if line.strip()]
    except Exception:
        raise UsageError(f"--history {path}: not valid JSON or JSONL (a list of {{\"role\", \"content\"}})") from None
    out: list[dict] = []
    for n, t in enumerate(turns, 1):
        if (not isinstance(t, dict) or t.get("role") not in ("user", "assistant")
                or not isinstance(t.get("content"), str) or not t["content"].strip()):
            raise UsageError(f"--history {path}, turn {n}: needs \"role\" user or assistant and a non-empty "
                             "\"content\"")
        out.append({"role": t["role"], "content": t["content"]})
    return out


class QuerySession:
    """One loaded index (and, if needed, one LLM client) answering many queries."""

    def __init__(self, project: ProjectDir, settings: Settings, *, history: list[dict] | None = None) -> None:
        self.project = project
        self.settings = settings
        self.history = history or []
        self.index = QueryIndex(project, settings)
        self.index.require_built()
        self._llm: Any = None
        self._reranker: Any = None

    @property
    def llm(self) -> Any:
        if self._llm is None and self.settings.llm.model:
            from hrag_cli.core.llm import query_client

            self._llm = query_client(self.project, self.settings.llm)
        return self._llm

    @property
    def reranker(self) -> Any:
        """The `query.rerank` model, made on first use (None when no reranker is set)."""
        if self._reranker is None and self.settings.query.rerank.strip():
            from hrag_cli.query.rerank import make_reranker

            self._reranker = make_reranker(self.project, self.settings)
        return self._reranker

    def run(self, query: str, *, mode: str | None = None, want_context: bool = False,
            want_answer: bool = False) -> tuple[Retrieval, dict]:
        t0 = time.perf_counter()
        r = retrieve(self.index, query, self.settings, mode=mode, llm=self.llm if self.settings.llm.model else None,
                     reranker=self.reranker)
        extra: dict[str, Any] = {}
        if want_context or want_answer:
            extra["context"] = build_context(r)
        if want_answer:
            extra.update(self.answer(r, extra["context"]))
        r.timings["total_ms"] = round((time.perf_counter() - t0) * 1000, 2)
        return r, extra

    def answer(self, r: Retrieval, context: str) -> dict:
        """The LLM answers from the context only; the [n] it cites are mapped back to chunks and paths."""
        from hrag_cli.extract.prompts import build_answer_messages

        if self.llm is None:
            raise UsageError("--answer needs an LLM: pass --llm-model or set HRAG_LLM_MODEL")
        q = self.settings.query
        messages = build_answer_messages(r.query, context, response_type=q.response_type, user_prompt=q.user_prompt,
                                         history=self.history)
        resp = self.llm.chat(messages, purpose="answer")
        cited: list[int] = []
        for m in _CITE.finditer(resp.text):
            n = int(m.group(1))
            if 1 <= n <= len(r.chunks) and n not in cited:
                cited.append(n)
        return {"answer": resp.text.strip(),
                "citations": [{"n": n, "chunk_id": r.chunks[n - 1].chunk_id, "path": r.chunks[n - 1].path,
                               "section": r.chunks[n - 1].section, "page": r.chunks[n - 1].page,
                               "where": r.chunks[n - 1].where} for n in cited]}

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()
        if self._reranker is not None:
            self._reranker.close()


def as_json(r: Retrieval, extra: dict, qid: str | None = None) -> dict:
    obj = r.to_json()
    if qid is not None:
        obj = {"id": qid, **obj}
    obj.update(extra)
    return obj


def _first_line(text: str, width: int = 90, heading: str = "") -> str:
    """The chunk's first line of body text: not its heading (the document column shows it) nor an underline."""
    line = next((ln.strip() for ln in text.splitlines()
                 if ln.strip() and ln.strip().strip("#=*-~^ ") not in ("", heading)), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def print_table(r: Retrieval, extra: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    # document text, paths, names and the query are data: "[/b]" or "[citation needed]" must print as written,
    # and a control character (an escape sequence that retitles or clears the terminal) as a visible escape
    from hrag_cli.core.redact import printable

    def escape(text: str, _markup=escape) -> str:
        return _markup(printable(text))

    from hrag_cli.core.progress import stdout_console

    console = stdout_console()
    table = Table(title=escape(f"{r.mode}: {r.query}"), title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("document")
    table.add_column("first line", overflow="fold")
    for i, c in enumerate(r.chunks, 1):
        table.add_row(str(i), f"{c.score:.4g}", escape(c.where), escape(_first_line(c.text, heading=c.section[-1] if c.section else "")))
    console.print(table)
    if r.entities:
        console.print("[bold]entities[/bold]: " + escape(", ".join(f"{e['name']} ({e['score']:.3g})" for e in r.entities[:15])),
                      highlight=False)
    if r.facts:
        console.print("[bold]facts[/bold]:", highlight=False)
        for f in r.facts:
            line = f"  ({f['subject']}, {f['predicate']}, {f['object']})  {f['score']:.3f}"
            console.print(printable(line), highlight=False, markup=False)
    if r.relations:
        console.print("[bold]relations[/bold]:", highlight=False)
        for x in r.relations[:10]:
            line = f"  {relation_arrow(x)}"
            console.print(printable(line), highlight=False, markup=False)
    if r.keywords:
        console.print("[bold]keywords[/bold]: " + escape(f"high={r.keywords.get('high')} low={r.keywords.get('low')}"),
                      highlight=False, markup=True)
    for note in r.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)
    if "answer" in extra:
        console.print("\n[bold]answer[/bold]")
        console.print(printable(extra["answer"]), markup=False, highlight=False)
        for c in extra["citations"]:
            console.print(printable(f"  [{c['n']}] {c.get('where') or c['path']}"), markup=False, highlight=False)

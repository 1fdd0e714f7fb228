"""hrag from Python: the index, query, status and export the `hrag` command runs, on one project directory.

    from hrag_cli import Project
    p = Project(".hrag-demo", settings={"extract.extractor": "rules", "embed.model": "builtin"})
    result = p.index(["sample_corpus"])          # IndexResult: .summary (dict), .exit_code (int)
    hits = p.query("Who founded the institute that warned of the Great Flood of 1987?", mode="ppr", k=5)
    for h in hits: print(h.score, h.source, h.text[:80])
    p.status()                                    # dict, as `hrag status --json`

`settings` are the names of hrag.toml and the CLI's flags (`section.name`), layered over the project's
hrag.toml and what it remembers, exactly as the flags are. Errors raise what the CLI turns into an exit code
(core/errors.py: UsageError 2, BudgetExceeded 3, HragError 1); a run that finished with failed chunks is not
an error: its IndexResult says so with exit_code 4, as `hrag index` does. The CLI is a thin layer over this
class: it parses flags, calls one method and prints what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, resolve_root
from hrag_cli.pipeline import IndexResult

if TYPE_CHECKING:
    from hrag_cli.query.types import Retrieval

STOP_AFTER = (None, "chunk", "extract", "resolve")


@dataclass
class Hit:
    """One retrieved chunk, best first."""

    rank: int
    score: float
    source: str     # the document's path, as `hrag query` prints it
    text: str
    chunk_id: str
    doc_id: str


def _import_source(lightrag: str | Path | None, graphrag: str | Path | None) -> Any:
    """The folder another tool wrote (LightRAG's working directory, GraphRAG's output) that is the corpus."""
    if lightrag is not None and graphrag is not None:
        raise UsageError("give --import-lightrag or --import-graphrag, not both")
    from hrag_cli.extract.imported import ImportSource

    if lightrag is not None:
        return ImportSource("lightrag", Path(lightrag))
    return ImportSource("graphrag", Path(graphrag)) if graphrag is not None else None


class Project:
    """One hrag project directory (default: $HRAG_PROJECT or ./.hrag) and the settings given for this use of it."""

    def __init__(self, root: str | Path | None = None, settings: Mapping[str, Any] | None = None, *,
                 reporter: Reporter | None = None) -> None:
        self.dir = ProjectDir(resolve_root(root))
        overrides = dict(settings or {})
        schema = overrides.get("extract.schema")
        if schema:   # remembered by the project: kept absolute, so it names the same file from anywhere
            overrides["extract.schema"] = str(Path(schema).expanduser().resolve())
        self.overrides = overrides
        self.reporter = reporter or Reporter("quiet")   # warnings still go to stderr

    @property
    def root(self) -> Path:
        return self.dir.root

    def settings(self, extra: Mapping[str, Any] | None = None, *, create: bool = False) -> Settings:
        """The settings a command would run with (every one checked before anything is created or written);
        without `create` the project must exist."""
        if not create:
            self.dir.require()
        settings = self.dir.settings({**self.overrides, **(extra or {})})
        if create and self.dir.root.exists() and not self.dir.root.is_dir():
            raise UsageError(f"project path {self.dir.root} exists and is not a directory")
        return settings

    # -- building ---------------------------------------------------------------------------------------
    def index(self, docs: Iterable[str | Path] | None = None, *, stop_after: str | None = None,
              dry_run: bool = False, max_cost: float | None = None, reparse: bool = False,
              retry_failed: bool = False, rehash: bool = False, import_openie: str | Path | None = None,
              import_lightrag: str | Path | None = None, import_graphrag: str | Path | None = None) -> IndexResult:
        """Load, chunk and extract `docs` (default: those indexed last time), then bring resolve and synonyms
        up to date (`hrag index`)."""
        if max_cost is not None and not (max_cost >= 0 and math.isfinite(max_cost)):
            raise UsageError(f"--max-cost: {max_cost} must be a number of USD, 0 or more")
        if stop_after not in STOP_AFTER:
            raise UsageError("--stop-after takes chunk, extract or resolve")
        settings = self.settings(create=True)
        from hrag_cli.extract.prune import check_prune_settings
        from hrag_cli.extract.stage import check_settings
        from hrag_cli.pipeline import IndexOptions, run_index

        check_settings(settings)         # a bad extractor fails before any stage writes
        check_prune_settings(settings)   # and so does a bad schema file, schema.mode or extract.grounding
        if (settings.embed.model or "builtin").strip() != "builtin" and stop_after is None:
            from hrag_cli.embed.embedder import get_embedder

            get_embedder(None, settings)   # an unknown embedding model fails now, not after chunks and graph
        options = IndexOptions(docs=[Path(d) for d in docs or []], stop_after=stop_after, dry_run=dry_run,
                               max_cost=max_cost, reparse=reparse, retry_failed=retry_failed,
                               import_openie=Path(import_openie) if import_openie is not None else None,
                               imported=_import_source(import_lightrag, import_graphrag),
                               rehash=rehash)
        return run_index(self.dir, settings, self.reporter, options)

    def resolve(self) -> dict:
        """Merge the current extraction records into the graph again, then what depends on it (`hrag resolve`)."""
        from hrag_cli.pipeline import rerun_stage

        return rerun_stage(self.dir, self.settings(), self.reporter, "resolve")

    def synonyms(self, *, review: str | Path | None = None, accept: str | Path | None = None) -> dict:
        """Embed, build the vector indices and SYNONYM edges again (`hrag synonyms`); `review` writes candidate
        pairs to a TSV instead, `accept` applies a reviewed one."""
        from hrag_cli.pipeline import rerun_stage
        from hrag_cli.stages import StageOptions

        options = StageOptions(review_path=Path(review) if review is not None else None,
                               accept_path=Path(accept) if accept is not None else None)
        return rerun_stage(self.dir, self.settings(), self.reporter, "synonyms", options)

    # -- reading ----------------------------------------------------------------------------------------
    def status(self, verify: bool = False) -> dict:
        """Each stage's state and counts, failures and LLM spend (`hrag status --json`); `verify` hashes every
        artifact whole."""
        from hrag_cli.pipeline import project_status

        return project_status(self.dir, self.settings(), verify=verify)

    def query(self, text: str, mode: str | None = None, k: int | None = None) -> list[Hit]:
        """The chunks that answer `text`, best first (`hrag query`)."""
        [(r, _)] = list(self.retrieve([text], mode=mode, k=k))
        return [Hit(i, c.score, c.path, c.text, c.chunk_id, c.doc_id) for i, c in enumerate(r.chunks, 1)]

    def retrieve(self, texts: Iterable[str], *, mode: str | None = None, k: int | None = None,
                 context: bool = False, answer: bool = False, history: Sequence[dict] | None = None,
                 settings: Mapping[str, Any] | None = None) -> Iterator[tuple[Retrieval, dict]]:
        """Each query's whole retrieval (chunks, entities, relations, facts, timings) and, with `context` or
        `answer`, {"context"} / {"answer", "citations"}; one loaded index answers them all. `settings`: query
        settings for these queries only."""
        from hrag_cli.query.run import QuerySession

        extra = {**(settings or {}), **({"query.mode": mode} if mode else {}),
                 **({"query.top_k": k} if k is not None else {})}
        session = QuerySession(self.dir, self.settings(extra), history=list(history or []))
        try:
            for text in texts:
                yield session.run(text, want_context=context, want_answer=answer)
        finally:
            session.close()

    def evaluate(self, qa: str | Path, modes: Sequence[str] = ("ppr", "naive"), ks: Sequence[int] = (2, 5),
                 settings: Mapping[str, Any] | None = None) -> dict:
        """Recall@k of each mode against a JSONL of questions and gold passages (`hrag eval --json`)."""
        from hrag_cli.query.evaluate import evaluate, load_qa
        from hrag_cli.query.retrieval import MODES

        settings_now = self.settings(settings)
        mode_list = [m.lower() for m in modes]
        bad = [m for m in mode_list if m not in MODES]
        if bad:
            raise UsageError(f"unknown mode {bad[0]!r}: choose from {', '.join(MODES)}")
        k_list = sorted(set(ks))
        if not k_list or k_list[0] < 1:
            raise UsageError("-k values must be at least 1")
        return evaluate(self.dir, settings_now, load_qa(Path(qa)), mode_list, k_list, self.reporter)

    # -- writing elsewhere ------------------------------------------------------------------------------
    def export(self, fmt: str, output: str | Path | None = None, *, url: str | None = None, graph: str = "hrag",
               select: str | None = None, hops: int = 1, progress: bool = False) -> dict:
        """Write the graph as GraphML, JSONL, CSV or Cypher, or load it into FalkorDB (`hrag export`)."""
        from hrag_cli.export.run import ExportOptions, run_export

        settings = self.settings()
        options = ExportOptions(fmt=fmt, output=Path(output) if output is not None else None, url=url, graph=graph,
                                select=select, hops=hops, progress=progress)
        return run_export(self.dir, settings, self.reporter, options)

    def view(self, output: str | Path = "graph.html", *, select: str | None = None, hops: int = 1,
             max_nodes: int = 2000, open_browser: bool = False) -> dict:
        """Write the graph as one self-contained HTML page (`hrag view`)."""
        from hrag_cli.view.page import ViewOptions, run_view

        self.settings()
        return run_view(self.dir, ViewOptions(output=Path(output), select=select, hops=hops, max_nodes=max_nodes,
                                              open_browser=open_browser))

    def suggest_schema(self, docs: Iterable[str | Path], *, sample: int = 20, seed: int = 0,
                       out: str | Path | None = None) -> tuple[str, dict, int]:
        """A draft schema (TOML text) from a sample of `docs`, its summary and exit code (`hrag schema
        suggest`); written to `out` (never over a file) when given."""
        from hrag_cli.schema_suggest import run_suggest

        settings = self.settings(create=True)
        return run_suggest(self.dir, settings, self.reporter, [Path(d) for d in docs], sample=sample, seed=seed,
                           out=Path(out) if out is not None else None)

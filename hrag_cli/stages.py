"""The stage contract: every stage is a `Stage` (name, upstream, outputs, a fingerprint function and a run
function from one `StageContext` to a StageOutcome), in the order core/stage_list.py declares them.

A stage's fingerprint = hash(upstream stages' output digests, the settings that shape its output); the
pipeline compares it with the one the manifest recorded to decide what is stale. Each run function below is a
small adapter that imports its stage module when called (so a command loads only what it runs) and turns the
context into that module's arguments. No stage module imports this one or the pipeline.

To give a stage a new option: a field on StageOptions (set by the command), read in its adapter here. A new
setting that shapes a stage's output goes into its module's `settings_fingerprint`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, StageOutcome, fingerprint
from hrag_cli.core.stage_list import DECLARED
from hrag_cli.extract.imported import ImportSource


@dataclass
class StageOptions:
    """What one command asks of the stages; each stage reads the fields it knows."""

    roots: list[Path] = field(default_factory=list)   # chunk: the folders and files to index
    write: bool = True               # chunk: False counts chunks and writes nothing (a dry run)
    rehash: bool = False             # chunk: read every file, even those whose stat stamp is unchanged;
                                     # extract: check every byte of the extraction cache against its index
    reparse: bool = False            # extract: rebuild LLM records from cached answers
    retry_failed: bool = False       # extract: extract failed chunks again
    max_cost: float | None = None    # extract: stop (resumably) at this LLM spend, USD
    import_openie: Path | None = None   # extract: take extractions from this OpenIE file
    imported: ImportSource | None = None   # chunk and extract: take documents, chunks and extractions from
                                           # another tool's folder (LightRAG, GraphRAG)
    review_path: Path | None = None  # synonyms: write candidate pairs here and change nothing
    accept_path: Path | None = None  # synonyms: apply this reviewed file


@dataclass
class StageContext:
    """Everything a stage's run function gets."""

    project: ProjectDir
    settings: Settings
    reporter: Reporter
    options: StageOptions = field(default_factory=StageOptions)
    summary: dict[str, Any] = field(default_factory=dict)   # the run's summary: the pipeline adds each stage's
                                                            # counts, a stage may add a line of its own
    handed: Any = None   # the payload of the stage that ran just before in this run (None: read from disk)


@dataclass(frozen=True)
class Stage:
    name: str
    upstream: tuple[str, ...]
    outputs: tuple[str, ...]
    fingerprint: Callable[[Settings], str]
    run: Callable[[StageContext], StageOutcome]
    # the stage reads its own previous record and files and does only what is new (chunk: the documents,
    # extract: the cache): `hrag index` runs it every time, the pipeline neither invalidates its record nor
    # clears its files before it runs, and a run of it alone is no reason to rebuild later stages
    resumes: bool = False


# ------------------------------------------------------------------------------------------------ chunk


def _chunk_fingerprint(settings: Settings) -> str:
    from hrag_cli.chunk.stage import settings_fingerprint

    return settings_fingerprint(settings)


def chunks_reusable(project: ProjectDir, settings: Settings, reporter: Reporter | None = None) -> bool:
    """Unchanged documents may keep their previous chunks only when chunking settings are the same and
    docs.jsonl / chunks.jsonl are intact."""
    damaged = project.check(stages=("chunk",))
    if damaged and reporter is not None:
        reporter.warn(f"{damaged[0]}; chunking every document again")
    prev = project.stage("chunk")
    return not damaged and prev is not None and prev.fingerprint == expected_fingerprint(project, settings, "chunk")


def _extract_current(project: ProjectDir, settings: Settings) -> bool:
    """Whether the extract stage's record was made over the chunks the files hold now (before this run's chunk
    stage): then what the chunk stage appends is all the extract stage has to look at."""
    try:
        return project.stage_state("extract", expected_fingerprint(project, settings, "extract")) == "fresh"
    except UsageError:      # bad extractor settings: said by the extract stage, after chunking
        return False


def _run_chunk(ctx: StageContext) -> StageOutcome:
    from hrag_cli.chunk.stage import ChunksHanded, run_chunk
    from hrag_cli.extract.stage import taken_ids

    project, settings, opts = ctx.project, ctx.settings, ctx.options
    if opts.imported is not None:
        return _import_chunks(ctx, opts.imported)
    if not opts.write:   # a dry run: every chunk, for the estimate
        out = run_chunk(project, settings, ctx.reporter, opts.roots, write=False,
                        reuse=chunks_reusable(project, settings))
        return StageOutcome(out.counts, out.output_digest, payload=ChunksHanded(out.chunks))
    reuse = chunks_reusable(project, settings, ctx.reporter)
    current = _extract_current(project, settings)
    taken = taken_ids(project, current) if reuse and not opts.rehash else None
    out = run_chunk(project, settings, ctx.reporter, opts.roots, reuse=reuse, rehash=opts.rehash, taken=taken)
    # extract takes these instead of reading chunks.jsonl (only the appended ones when its record covers the
    # rest; the whole file when chunks were appended past a record that does not); resolve reads the file
    chunks = None if out.appended and not current else out.chunks
    return StageOutcome(out.counts, out.output_digest, payload=ChunksHanded(chunks, added=out.appended and current))


def _import_chunks(ctx: StageContext, source: ImportSource) -> StageOutcome:
    """--import-lightrag / --import-graphrag: the other tool's own chunks, one for one, instead of chunking the
    documents again."""
    from hrag_cli.chunk.stage import ChunksHanded, write_imported
    from hrag_cli.extract.importers import importer

    mod = importer(source.kind)
    path = mod.check_dir(source.path)
    corpus = mod.read_corpus(path)
    if not corpus.chunks:
        raise UsageError(f"{source.flag}: {path} holds no chunks (nothing was indexed there)")
    if not ctx.options.write:
        return StageOutcome({"docs": len(corpus.documents), "chunks": len(corpus.chunks)}, "",
                            payload=ChunksHanded(corpus.chunks))
    out = write_imported(ctx.project, corpus.documents, corpus.chunks, ImportSource(source.kind, path),
                         corpus.counts)
    return StageOutcome(out.counts, out.output_digest, payload=ChunksHanded(out.chunks))


# ------------------------------------------------------------------------------------------------ extract


def _extract_fingerprint(settings: Settings) -> str:
    from hrag_cli.extract.stage import settings_fingerprint

    return settings_fingerprint(settings)


def _run_extract(ctx: StageContext) -> StageOutcome:
    from hrag_cli.built_with import previous_import, remember
    from hrag_cli.chunk.stage import ChunksHanded
    from hrag_cli.extract.stage import run_extract

    project, settings, opts = ctx.project, ctx.settings, ctx.options
    if opts.rehash:   # trust no sample: every byte of the extraction cache is checked against its index
        from hrag_cli.extract import cache_index

        cache_index.entries(project, full=True)
    # imported chunks take the imported extractions unless an extractor is asked for by name
    imported = opts.imported if settings.extract.extractor == "auto" else None
    import_openie = None if imported else opts.import_openie or previous_import(project, settings, ctx.reporter)
    remember(project, settings, ctx.reporter, ctx.summary, openie=import_openie is not None or imported is not None)
    handed = ctx.handed if isinstance(ctx.handed, ChunksHanded) else ChunksHanded(None)
    return run_extract(project, settings, ctx.reporter, reparse=opts.reparse, retry_failed=opts.retry_failed,
                       max_cost=opts.max_cost, import_openie=import_openie, imported=imported,
                       chunks=handed.chunks,
                       added=handed.added)


# ------------------------------------------------------------------------------------------------ the rest


def _prune_fingerprint(settings: Settings) -> str:
    from hrag_cli.extract.prune import settings_fingerprint

    return settings_fingerprint(settings)


def _run_prune(ctx: StageContext) -> StageOutcome:
    from hrag_cli.extract.prune import run_prune

    return run_prune(ctx.project, ctx.settings, ctx.reporter)


def _resolve_fingerprint(settings: Settings) -> str:
    from hrag_cli.resolve.stage import settings_fingerprint

    return settings_fingerprint(settings)


def _run_resolve(ctx: StageContext) -> StageOutcome:
    from hrag_cli.resolve.stage import run_resolve

    return run_resolve(ctx.project, ctx.settings, ctx.reporter)


def _synonyms_fingerprint(settings: Settings) -> str:
    from hrag_cli.embed.stage import settings_fingerprint

    return settings_fingerprint(settings)


def _run_synonyms(ctx: StageContext) -> StageOutcome:
    from hrag_cli.embed.stage import run_synonyms

    return run_synonyms(ctx.project, ctx.settings, ctx.reporter, review_path=ctx.options.review_path,
                        accept_path=ctx.options.accept_path)


# name -> (fingerprint, run, resumes), for each stage core/stage_list.py declares
_FUNCTIONS: dict[str, tuple[Callable[[Settings], str], Callable[[StageContext], StageOutcome], bool]] = {
    "chunk": (_chunk_fingerprint, _run_chunk, True),
    "extract": (_extract_fingerprint, _run_extract, True),
    "prune": (_prune_fingerprint, _run_prune, False),
    "resolve": (_resolve_fingerprint, _run_resolve, False),
    "synonyms": (_synonyms_fingerprint, _run_synonyms, False),
}
STAGES: dict[str, Stage] = {d.name: Stage(d.name, d.upstream, d.outputs, *_FUNCTIONS[d.name]) for d in DECLARED}
ORDER: tuple[str, ...] = tuple(STAGES)


def expected_fingerprint(project: ProjectDir, settings: Settings, stage: str, extra: Any = None) -> str:
    """What `stage`'s fingerprint would be if built now from the current upstream outputs."""
    stages = project.manifest()["stages"]
    spec = STAGES[stage]
    digests = [stages.get(s, {}).get("output_digest", "") for s in spec.upstream]
    return fingerprint(stage, digests, spec.fingerprint(settings), extra)

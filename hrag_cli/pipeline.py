"""Runs the stages in order and decides which are stale.

A stage's fingerprint = hash(upstream stages' output digests, the settings that shape its output). The
manifest stores the fingerprint a stage was built with; when the fingerprint computed now differs, the stage
is stale and rebuilds. Stage modules are imported lazily so one command loads only what it runs.

Commits: a run fills a new generation (Project.generation) and makes it current only when it ends, so a
killed run never leaves a mix; inside it, a stage's record is invalidated before its outputs are touched, and
a stage whose recorded artifacts fail their check is rebuilt from its inputs.
"""

from __future__ import annotations

import importlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrag_cli.core.config import Settings
from hrag_cli.core.errors import (EXIT_BUDGET, EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, BudgetExceeded, RunStopped,
                                   UsageError)
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import Project, StageOutcome, fingerprint


@dataclass(frozen=True)
class Stage:
    """The one contract between the pipeline and a stage: its module has `settings_fingerprint(settings) -> str`
    and a run function (project, settings, reporter, ...) -> StageOutcome; the files it writes are declared in
    project.STAGE_OUTPUTS. The pipeline calls these; no stage module imports the pipeline."""

    name: str
    module: str
    run: str
    upstream: tuple[str, ...]   # stages whose output digests enter this stage's fingerprint

    def load(self, attr: str) -> Any:
        return getattr(importlib.import_module(f"hrag_cli.{self.module}"), attr)


STAGES = {s.name: s for s in (
    Stage("chunk", "chunk.stage", "run_chunk", ()),
    Stage("extract", "extract.stage", "run_extract", ("chunk",)),
    Stage("prune", "extract.prune", "run_prune", ("extract",)),     # counts only: resolve prunes records as it reads them
    Stage("resolve", "resolve.stage", "run_resolve", ("prune", "chunk")),   # the graph holds chunk vertices too
    Stage("synonyms", "embed.stage", "run_synonyms", ("resolve", "chunk")),
)}
STAGE_ORDER = tuple(STAGES)


@dataclass
class IndexOptions:
    docs: list[Path] = field(default_factory=list)
    stop_after: str | None = None
    dry_run: bool = False
    max_cost: float | None = None
    reparse: bool = False
    retry_failed: bool = False
    import_openie: Path | None = None
    rehash: bool = False     # read every document file, even those whose stat stamp is unchanged


@dataclass
class IndexResult:
    summary: dict
    exit_code: int


def expected_fingerprint(project: Project, settings: Settings, stage: str, extra: Any = None) -> str:
    """What `stage`'s fingerprint would be if built now from the current upstream outputs."""
    stages = project.manifest()["stages"]
    spec = STAGES[stage]
    digests = [stages.get(s, {}).get("output_digest", "") for s in spec.upstream]
    return fingerprint(stage, digests, spec.load("settings_fingerprint")(settings), extra)


def _run_stage(project: Project, settings: Settings, reporter: Reporter, stage: str, **kwargs: Any) -> StageOutcome:
    fp = expected_fingerprint(project, settings, stage)
    spec = STAGES[stage]
    fn = spec.load(spec.run)
    if not kwargs.get("review_path"):
        _clear_damage(project, reporter, stage)   # an incremental stage must not extend a damaged file
        project.invalidate_stage(stage)           # the record stops vouching before any output is touched
    outcome = fn(project, settings, reporter, **kwargs)
    if outcome.counts.get("review_only"):
        return outcome   # `synonyms --review` wrote a TSV and changed nothing in graph/: the stage stays as it was
    project.record_stage(stage, fp, outcome.output_digest, outcome.counts)
    return outcome


def _clear_damage(project: Project, reporter: Reporter, stage: str) -> None:
    """A stage whose recorded files fail their check loses them (so it rebuilds them from its inputs instead of
    extending them)."""
    damaged = project.check(stages=(stage,))
    if damaged:
        reporter.warn(f"{damaged[0]}; rebuilding the {stage} stage from its inputs")
        project.remove_outputs(stage)


def _bring_up_to_date(project: Project, settings: Settings, reporter: Reporter, stages: tuple[str, ...],
                      summary: dict, force: bool = False) -> None:
    for stage in stages:
        fp = expected_fingerprint(project, settings, stage)
        # a damaged stage runs; _run_stage clears its files (checking here too would warn twice)
        if not force and project.stage_state(stage, fp) == "fresh" and not project.check(stages=(stage,)):
            summary[stage] = "fresh"
            continue
        outcome = _run_stage(project, settings, reporter, stage)
        summary[stage] = outcome.counts
        # a stage that ran rewrote files later stages read even when its digest is unchanged (resolve writes
        # graph.pkl without SYNONYM edges), so everything after it runs too; synonyms is incremental, so cheap
        force = True


def _previous_import(project: Project, settings: Settings, reporter: Reporter) -> Path | None:
    """A project built with --import-openie keeps its imported extractions on a plain `hrag index` (a cron
    job must not silently swap them for the rules extractor); an explicit --extractor switches."""
    recorded = project.recorded("extract", "openie_file")
    if not recorded or settings.extract.extractor != "auto":
        return None
    if not Path(recorded).is_file():
        raise UsageError(f"this project's extractions were imported from {recorded}, which is gone: "
                         "pass --import-openie FILE again, or --extractor rules/llm to switch")
    reporter.info(f"re-importing OpenIE extractions from {recorded} (pass --extractor to switch)")
    return Path(recorded)


def _extract_current(project: Project, settings: Settings) -> bool:
    """Whether the extract stage's record was made over the chunks the files hold now (before this run's chunk
    stage): then what the chunk stage appends is all the extract stage has to look at."""
    try:
        return project.stage_state("extract", expected_fingerprint(project, settings, "extract")) == "fresh"
    except UsageError:      # bad extractor settings: said by the extract stage, after chunking
        return False


def _chunks_reusable(project: Project, settings: Settings, reporter: Reporter | None = None) -> bool:
    """Unchanged documents may keep their previous chunks only when chunking settings are the same and
    docs.jsonl / chunks.jsonl are intact."""
    damaged = project.check(stages=("chunk",))
    if damaged and reporter is not None:
        reporter.warn(f"{damaged[0]}; chunking every document again")
    prev = project.stage("chunk")
    return not damaged and prev is not None and prev.fingerprint == expected_fingerprint(project, settings, "chunk")


EMBED_KEYS = ("embed.model", "embed.api_base", "embed.precision")


def built_with(settings: Settings, *, openie: bool = False) -> dict[str, str]:
    """What a project remembers of a run's settings (Project.remember): never an API key."""
    from hrag_cli.extract.stage import extractor_kind

    return {"extract.extractor": "auto" if openie else extractor_kind(settings),
            "llm.model": settings.llm.model, "llm.api_base": settings.llm.api_base,
            **({"extract.schema": settings.extract.schema} if settings.extract.schema else {}),
            **embedded_with(settings)}


def embedded_with(settings: Settings) -> dict[str, str]:
    e = settings.embed
    return {"embed.model": e.model, "embed.api_base": e.api_base, "embed.precision": e.precision}


def describe_built_with(values: dict) -> str:
    kind = values.get("extract.extractor", "")
    schema = f" with the schema {values['extract.schema']}" if values.get("extract.schema") else ""
    if kind != "llm":
        return {"auto": "imported extractions (--import-openie)"}.get(kind, f"the {kind} extractor") + schema
    where = f" at {values['llm.api_base']}" if values.get("llm.api_base") else ""
    return f"the LLM {values.get('llm.model', '')}{where}{schema}"


def describe_embedder(values: dict) -> str:
    model = values.get("embed.model", "builtin")
    where = f" at {values['embed.api_base']}" if values.get("embed.api_base") else ""
    precision = f" ({values['embed.precision']})" if model.startswith("st:") and values.get("embed.precision") else ""
    return f"the embedder {model}{where}{precision}"


def _remember(project: Project, settings: Settings, reporter: Reporter, summary: dict | None = None, *,
              openie: bool | None) -> None:
    """Remember this run's extractor, model and API base, and its embedder; a change (only ever explicit, since a
    plain run reuses what is remembered) is said in one line. `openie` None: a run that does not extract
    (`hrag synonyms`) remembers its embedder only."""
    before = project.remembered()
    now = {**before, **embedded_with(settings)} if openie is None else built_with(settings, openie=openie)
    if summary is not None:
        summary["built_with"] = describe_built_with(now)
    if before == now:
        return
    extract_keys = [k for k in now if k not in EMBED_KEYS]
    if before and any(before.get(k) != now.get(k) for k in extract_keys):
        reporter.info(f"extracting with {describe_built_with(now)} from now on, as given "
                      f"(was {describe_built_with(before)})")
    # a project remembered before embedders were (no embed key yet) is not told of a change it did not make
    if any(k in before for k in EMBED_KEYS) and any(before.get(k) != now[k] for k in EMBED_KEYS):
        reporter.info(f"embedding with {describe_embedder(now)} from now on, as given (was "
                      f"{describe_embedder(before)}): every vector is embedded again")
    project.remember(now)


def index_failure(summary: dict, code: int) -> dict | None:
    """The failure object `hrag index --json` adds to a run that did not do its whole job (exit 1, 3 or 4):
    what went wrong and what to do; None for a run that did."""
    if code == EXIT_OK:
        return None
    extract = summary.get("extract") if isinstance(summary.get("extract"), dict) else {}
    if code == EXIT_BUDGET:
        return {"cause": str(extract.get("stopped", "the run's LLM spend reached --max-cost")),
                "fix": "raise --max-cost, or run the same command again to continue", "exit_code": code}
    failed, partial = extract.get("failed", 0), extract.get("partial", 0)
    return {"cause": f"{failed} chunk(s) failed and {partial} are partial",
            "fix": "'hrag status' names them and why; fix the cause, then 'hrag index --retry-failed'",
            "exit_code": code}


def _extract_exit_code(counts: dict) -> int:
    """Failed or partial chunks: 4 (partial; --retry-failed), or 1 when not one chunk was extracted."""
    bad = counts.get("failed", 0) + counts.get("partial", 0)
    if not bad:
        return EXIT_OK
    usable = counts.get("chunks", 0) - counts.get("failed", 0) - counts.get("pending", 0)
    return EXIT_FAILED if usable <= 0 and counts.get("failed", 0) else EXIT_PARTIAL


def run_index(project: Project, settings: Settings, reporter: Reporter, options: IndexOptions) -> IndexResult:
    """chunk → extract → (resolve → synonyms when stale). Budget stops are clean: what was extracted stays."""
    if options.stop_after not in (None, "chunk", "extract", "resolve"):
        raise UsageError("--stop-after takes chunk, extract or resolve")
    summary: dict[str, Any] = {}
    roots = list(options.docs)
    if not roots:   # the roots of the last run (a damaged manifest: from project.json)
        recorded = project.recorded("chunk", "roots") or []
        if not recorded:
            raise UsageError("no DOCS given and nothing indexed before: hrag index DOCS")
        roots = [Path(r) for r in recorded]
    if options.dry_run:   # reads the project, writes nothing, needs no lock
        from hrag_cli.extract.stage import estimate

        run_chunk = STAGES["chunk"].load("run_chunk")
        chunked = run_chunk(project, settings, reporter, roots, write=False, reuse=_chunks_reusable(project, settings))
        summary["chunk"] = chunked.counts
        summary["estimate"] = estimate(project, settings, chunked)
        return IndexResult(summary, EXIT_OK)
    created = not project.root.exists()
    try:
        return _index(project, settings, reporter, options, roots, summary)
    except UsageError:
        if created and project.unused():   # bad input found mid-run: leave no project behind, as promised
            shutil.rmtree(project.root, ignore_errors=True)
        raise


def _index(project: Project, settings: Settings, reporter: Reporter, options: IndexOptions, roots: list[Path],
           summary: dict[str, Any]) -> IndexResult:
    run_chunk, run_extract = STAGES["chunk"].load("run_chunk"), STAGES["extract"].load("run_extract")
    taken_ids = STAGES["extract"].load("taken_ids")
    stopped: RunStopped | None = None
    with project.lock(), project.generation():
        if project.drop_damaged_manifest():
            reporter.warn("manifest.json was damaged; rebuilding every stage from the documents and the caches")
        first = project.stage("extract") is None and project.stage("resolve") is None   # no graph yet
        chunk_fp = expected_fingerprint(project, settings, "chunk")
        reuse = _chunks_reusable(project, settings, reporter)
        current = _extract_current(project, settings)
        taken = taken_ids(project, current) if reuse and not options.rehash else None
        chunked = run_chunk(project, settings, reporter, roots, reuse=reuse, rehash=options.rehash, taken=taken)
        summary["chunk"] = chunked.counts
        project.record_stage("chunk", chunk_fp, chunked.output_digest, chunked.counts)
        # extract reads them instead of chunks.jsonl (only the appended ones, when the extract stage's record
        # covers the rest; else it reads the file); resolve reads the file itself
        appended = chunked.appended and current
        chunks = None if chunked.appended and not current else chunked.chunks
        del chunked
        if options.stop_after == "chunk":
            return IndexResult(summary, EXIT_OK)

        if options.rehash:   # trust no sample: every byte of the extraction cache is checked against its index
            from hrag_cli.extract import cache_index

            cache_index.entries(project, full=True)
        import_openie = options.import_openie or _previous_import(project, settings, reporter)
        _remember(project, settings, reporter, summary, openie=import_openie is not None)
        extract_fp = expected_fingerprint(project, settings, "extract")
        try:
            extracted = run_extract(project, settings, reporter, reparse=options.reparse,
                                    retry_failed=options.retry_failed, max_cost=options.max_cost,
                                    import_openie=import_openie, chunks=chunks, added=appended)
        except BudgetExceeded as exc:
            summary["extract"] = {"stopped": str(exc)}
            reporter.warn(str(exc))     # the message already says that a re-run continues
            project.discard_generation()   # readers keep the last complete version; cache/ keeps what was paid
            return IndexResult(summary, EXIT_BUDGET)
        except RunStopped as exc:
            summary["extract"] = {**exc.counts, "stopped": exc.cause or str(exc)}
            exc.counts = summary
            if not first:
                raise              # the last complete version stays current
            # a first run keeps its chunks and what it was asked to use, so `hrag status` says both and that
            # nothing was extracted; the same command picks up from there
            project.forget_stage("extract")
            stopped = exc
        if stopped is None:
            del chunks    # every chunk's text: keep none of it alive through resolve
            summary["extract"] = extracted.counts
            if extracted.counts.get("pending", 0) == 0:
                project.record_stage("extract", extract_fp, extracted.output_digest, extracted.counts)
            else:
                project.forget_stage("extract")
            code = _extract_exit_code(extracted.counts)   # resolve still merges what was extracted
            if options.stop_after == "extract":
                return IndexResult(summary, code)
            later = ("prune", "resolve") if options.stop_after == "resolve" else ("prune", "resolve", "synonyms")
            _bring_up_to_date(project, settings, reporter, later, summary)
    if stopped is not None:
        raise stopped
    return IndexResult(summary, code)


def rerun_stage(project: Project, settings: Settings, reporter: Reporter, stage: str, **kwargs: Any) -> dict:
    """`hrag resolve` / `hrag synonyms`: rebuild that stage now, then whatever depends on it."""
    if project.stage("extract") is None:
        raise UsageError(f"nothing to {stage} yet: run 'hrag index DOCS' first")
    summary: dict[str, Any] = {}
    with project.lock(), project.generation():
        if stage == "resolve":   # resolve prunes as it reads: the prune counts must describe the same pruning
            _bring_up_to_date(project, settings, reporter, ("prune",), summary)
        if stage == "synonyms":
            _remember(project, settings, reporter, openie=None)
        outcome = _run_stage(project, settings, reporter, stage, **kwargs)
        summary[stage] = outcome.counts
        after = STAGE_ORDER[STAGE_ORDER.index(stage) + 1:]
        _bring_up_to_date(project, settings, reporter, tuple(after), summary,
                          force=not outcome.counts.get("review_only"))
    return summary


def project_status(project: Project, settings: Settings, verify: bool = False) -> dict:
    """Stage states (fresh / stale / missing / damaged), counts, failures and LLM spend; read-only. `verify`
    hashes every artifact whole instead of sampling it."""
    from hrag_cli.resolve.aliases import merges_status
    from hrag_cli.extract.stage import extraction_status
    from hrag_cli.core.llm import spend_summary

    info: dict[str, Any] = {"stages": {}}
    problems = project.check(full=verify)
    if verify:   # the extraction cache against its index, every byte (status counts from what it finds)
        from hrag_cli.extract import cache_index

        cache_index.entries(project, full=True)
    for stage in STAGE_ORDER:
        rec = project.stage(stage)
        try:
            state = project.stage_state(stage, expected_fingerprint(project, settings, stage))
        except UsageError as exc:   # e.g. the remembered schema file is gone: say so, show the rest
            state = "stale"
            info.setdefault("settings_error", str(exc))
        mine = [str(p) for p in problems if p.stage == stage]
        if mine and state != "missing":
            state = "damaged"
        counts = dict(rec.counts) if rec else {}
        if "ungrounded_chunks" in counts:   # a list: shown below the table, not in it
            info["ungrounded_chunks"] = counts.pop("ungrounded_chunks")
        info["stages"][stage] = {"state": state, "finished_at": rec.finished_at if rec else "", "counts": counts}
        if mine:
            info["stages"][stage]["damaged"] = mine
    if problems:
        info["damaged"] = [f"{p}: 'hrag index' rebuilds the {p.stage} stage" for p in problems]
    remembered = project.remembered()
    info["built_with"] = describe_built_with(remembered) if remembered else ""
    info["embedded_with"] = describe_embedder(remembered) if "embed.model" in remembered else ""
    info.update(extraction_status(project, settings))
    info.update(merges_status(project))
    info["llm"] = spend_summary(project)
    info["query_llm"] = spend_summary(project, project.query_llm_cache_path)
    from hrag_cli.embed.embedder import embed_status

    info["embed"] = embed_status(project, settings)
    return info

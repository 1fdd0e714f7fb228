"""Runs the stages in order and decides which are stale (the stage contract and list: stages.py).

A stage whose fingerprint computed now differs from the one its manifest record holds is stale and rebuilds.

Commits: a run fills a new generation (ProjectDir.generation) and makes it current only when it ends, so a
killed run never leaves a mix; inside it, a stage's record is invalidated before its outputs are touched, and
a stage whose recorded artifacts fail their check is rebuilt from its inputs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrag_cli.core.config import Settings
from hrag_cli.core.errors import (EXIT_BUDGET, EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, BudgetExceeded, RunStopped,
                                   UsageError)
from hrag_cli.core.interrupt import Interrupted
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, StageOutcome
from hrag_cli.extract.imported import ImportSource
from hrag_cli.stages import ORDER, STAGES, Stage, StageContext, StageOptions, expected_fingerprint


@dataclass
class IndexOptions:
    docs: list[Path] = field(default_factory=list)
    stop_after: str | None = None
    dry_run: bool = False
    max_cost: float | None = None
    reparse: bool = False
    retry_failed: bool = False
    import_openie: Path | None = None
    imported: ImportSource | None = None   # another tool's folder instead of DOCS (--import-lightrag, ...)
    rehash: bool = False     # read every document file, even those whose stat stamp is unchanged


@dataclass
class IndexResult:
    summary: dict
    exit_code: int


def _run_stage(ctx: StageContext, stage: Stage) -> StageOutcome:
    project = ctx.project
    fp = expected_fingerprint(project, ctx.settings, stage.name)
    # a review writes a TSV and changes no stage output; a resuming stage reads its own record and files
    if not stage.resumes and ctx.options.review_path is None:
        _clear_damage(ctx, stage.name)            # an incremental stage must not extend a damaged file
        project.invalidate_stage(stage.name)      # the record stops vouching before any output is touched
    outcome = stage.run(ctx)
    if outcome.counts.get("review_only"):
        return outcome   # `synonyms --review` wrote a TSV and changed nothing in graph/: the stage stays as it was
    if outcome.counts.get("pending", 0):
        project.forget_stage(stage.name)   # work left: the next run continues it
    else:
        project.record_stage(stage.name, fp, outcome.output_digest, outcome.counts)
    return outcome


def _clear_damage(ctx: StageContext, stage: str) -> None:
    """A stage whose recorded files fail their check loses them (so it rebuilds them from its inputs instead of
    extending them)."""
    damaged = ctx.project.check(stages=(stage,))
    if damaged:
        ctx.reporter.warn(f"{damaged[0]}; rebuilding the {stage} stage from its inputs")
        ctx.project.remove_outputs(stage)


def _bring_up_to_date(ctx: StageContext, stages: tuple[str, ...], force: bool = False) -> None:
    """Run each of `stages` that is stale, damaged or resuming (every one with `force`), in order; the payload a
    stage returns is handed to the next one."""
    project, settings = ctx.project, ctx.settings
    for name in stages:
        stage = STAGES[name]
        # a damaged stage runs; _run_stage clears its files (checking here too would warn twice)
        if not (force or stage.resumes) and project.stage_state(name, expected_fingerprint(project, settings, name)) \
                == "fresh" and not project.check(stages=(name,)):
            ctx.summary[name] = "fresh"
            ctx.handed = None
            continue
        try:
            outcome = _run_stage(ctx, stage)
        except BudgetExceeded as exc:
            ctx.summary[name] = {"stopped": str(exc)}
            raise
        ctx.summary[name] = outcome.counts
        ctx.handed = outcome.payload
        del outcome   # the payload lives in ctx.handed until the next stage has run
        # a stage that ran rewrote files later stages read even when its digest is unchanged (resolve writes
        # graph.pkl without SYNONYM edges), so everything after it runs too; synonyms is incremental, so cheap
        force = force or not stage.resumes
    ctx.handed = None


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


def run_index(project: ProjectDir, settings: Settings, reporter: Reporter, options: IndexOptions) -> IndexResult:
    """chunk → extract → (prune → resolve → synonyms when stale). Budget stops are clean: what was extracted
    stays."""
    if options.stop_after not in (None, "chunk", "extract", "resolve"):
        raise UsageError("--stop-after takes chunk, extract or resolve")
    summary: dict[str, Any] = {}
    roots = list(options.docs)
    imported = options.imported
    if imported is not None and roots:
        raise UsageError(f"give DOCS or {imported.flag} DIR, not both (the imported folder is the corpus)")
    if imported is None and not roots:   # a project imported from another tool imports it again
        imported = ImportSource.from_json(project.recorded("chunk", "imported_from"))
    if imported is not None:
        roots = [imported.path]
    if not roots:   # the roots of the last run (a damaged manifest: from project.json)
        recorded = project.recorded("chunk", "roots") or []
        if not recorded:
            raise UsageError("no DOCS given and nothing indexed before: hrag index DOCS")
        roots = [Path(r) for r in recorded]
    if options.dry_run:   # reads the project, writes nothing, needs no lock
        from hrag_cli.extract.estimate import estimate

        ctx = StageContext(project, settings, reporter,
                           StageOptions(roots=roots, write=False, imported=imported), summary)
        chunked = STAGES["chunk"].run(ctx)
        summary["chunk"] = chunked.counts
        summary["estimate"] = estimate(project, settings, chunked.payload)
        return IndexResult(summary, EXIT_OK)
    opts = StageOptions(roots=roots, rehash=options.rehash, reparse=options.reparse,
                        retry_failed=options.retry_failed, max_cost=options.max_cost,
                        import_openie=options.import_openie, imported=imported)
    created = not project.root.exists()
    try:
        return _index(StageContext(project, settings, reporter, opts, summary), options.stop_after)
    except UsageError:
        if created and project.unused():   # bad input found mid-run: leave no project behind, as promised
            shutil.rmtree(project.root, ignore_errors=True)
        raise


def _index(ctx: StageContext, stop_after: str | None) -> IndexResult:
    project = ctx.project
    stages = ORDER[:ORDER.index(stop_after) + 1] if stop_after else ORDER
    stopped: RunStopped | Interrupted | None = None
    with project.lock(), project.generation():
        if project.drop_damaged_manifest():
            ctx.reporter.warn("manifest.json was damaged; rebuilding every stage from the documents and the caches")
        first = project.stage("extract") is None and project.stage("resolve") is None   # no graph yet
        try:
            _bring_up_to_date(ctx, stages)
        except BudgetExceeded as exc:
            ctx.reporter.warn(str(exc))     # the message already says that a re-run continues
            project.discard_generation()    # readers keep the last complete version; cache/ keeps what was paid
            return IndexResult(ctx.summary, EXIT_BUDGET)
        except (RunStopped, Interrupted) as exc:
            if isinstance(exc, Interrupted) and not exc.counts:
                exc.counts = ctx.summary   # stopped outside extraction's requests: mid-stage, nothing is kept
                raise
            why = f"interrupted by {exc.name}" if isinstance(exc, Interrupted) else exc.cause or str(exc)
            ctx.summary["extract"] = {**exc.counts, "stopped": why}
            exc.counts = ctx.summary
            if not first:
                raise              # the last complete version stays current
            # a first run keeps its chunks and what it was asked to use, so `hrag status` says both and what
            # was extracted; the same command picks up from there
            project.forget_stage("extract")
            stopped = exc
        # resolve still merged what was extracted
        code = _extract_exit_code(ctx.summary["extract"]) if "extract" in ctx.summary else EXIT_OK
    if stopped is not None:
        raise stopped
    return IndexResult(ctx.summary, code)


def rerun_stage(project: ProjectDir, settings: Settings, reporter: Reporter, stage: str,
                options: StageOptions | None = None) -> dict:
    """`hrag resolve` / `hrag synonyms`: rebuild that stage now, then whatever depends on it."""
    if project.stage("extract") is None:
        raise UsageError(f"nothing to {stage} yet: run 'hrag index DOCS' first")
    ctx = StageContext(project, settings, reporter, options or StageOptions())
    with project.lock(), project.generation():
        if stage == "resolve":   # resolve prunes as it reads: the prune counts must describe the same pruning
            _bring_up_to_date(ctx, ("prune",))
        if stage == "synonyms":
            from hrag_cli.built_with import remember

            remember(project, settings, reporter, openie=None)
        outcome = _run_stage(ctx, STAGES[stage])
        ctx.summary[stage] = outcome.counts
        _bring_up_to_date(ctx, ORDER[ORDER.index(stage) + 1:], force=not outcome.counts.get("review_only"))
    return ctx.summary


def project_status(project: ProjectDir, settings: Settings, verify: bool = False) -> dict:
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
    for stage in ORDER:
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
        if "skipped" in counts:   # the files not indexed, with their reasons: shown below the table too
            info["not_indexed"] = {"files": counts.pop("skipped"), "by_reason": counts.pop("skipped_by_reason", {}),
                                   "by_ext": counts.pop("skipped_by_ext", {})}
        info["stages"][stage] = {"state": state, "finished_at": rec.finished_at if rec else "", "counts": counts}
        if mine:
            info["stages"][stage]["damaged"] = mine
    if problems:
        info["damaged"] = [f"{p}: 'hrag index' rebuilds the {p.stage} stage" for p in problems]
    from hrag_cli.built_with import describe_built_with, describe_embedder

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

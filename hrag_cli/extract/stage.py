"""The extract stage: one extraction record per current chunk, cached by (chunk text, extractor fingerprint).

cache/extractions.jsonl is append-only and keeps every record ever made; the latest record of a chunk for
an extractor is the one that counts. A chunk that has a record (ok, partial or failed) for the current
extractor is never extracted again, except failed and partial ones under --retry-failed, so a plain re-run of
an unchanged corpus makes no LLM call and a killed run resumes where it stopped. Records are appended the moment a chunk is
done; a budget stop lets the requests in flight finish and saves them before BudgetExceeded propagates.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import BudgetExceeded, RunStopped, UsageError
from hrag_cli.core.forkpool import forked_map, ranges
from hrag_cli.core.interrupt import Interrupted
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, StageOutcome, StageRecord, fingerprint
from hrag_cli.core.records import Chunk, ExtractionRecord
from hrag_cli.extract import cache_index
from hrag_cli.extract.cache_index import Seen, full_record, seen_of
from hrag_cli.extract.cache_index import count as _int
from hrag_cli.extract.parser import PARSER_VERSION, add_counts
from hrag_cli.extract.rules import RULES_FINGERPRINT, extract_rules
from hrag_cli.chunk.stage import added_since, chunk_mark, load_chunks

EXTRACTORS = ("auto", "llm", "rules")
USABLE = ("ok", "partial")      # record statuses whose rows resolve merges
STREAK = 3                      # chunks in a row failing for one cause that stop the run (llm.FailureCause)
STREAK_KINDS = ("context", "timeout", "server")   # the FailureCause kinds that may be one chunk's own problem


# ------------------------------------------------------------------------------------------- fingerprints


def extractor_kind(settings: Settings) -> str:
    """'llm' or 'rules' for these settings; a bad --extractor, or llm without a model, is a usage error."""
    choice = (settings.extract.extractor or "auto").strip().lower()
    if choice not in EXTRACTORS:
        raise UsageError(f"--extractor takes {', '.join(EXTRACTORS)}, not '{settings.extract.extractor}'")
    if choice == "auto":
        return "llm" if settings.llm.model else "rules"
    if choice == "llm" and not settings.llm.model:
        raise UsageError("--extractor llm needs a model: --llm-model, $HRAG_LLM_MODEL or [llm] model in hrag.toml")
    return choice


def check_settings(settings: Settings) -> None:
    """Fail fast on extractor settings before any stage writes anything (numeric ranges: config.RANGES)."""
    extractor_kind(settings)
    from hrag_cli.cluster import require_ray

    require_ray(settings.cluster.ray)
    e = settings.extract
    if (e.format or "auto").strip().lower() not in ("auto", "json", "delimited"):
        raise UsageError(f"[extract] format takes auto, json or delimited, not '{e.format}'")
    from hrag_cli.extract.candidates import hint_source

    hint_source(e)
    if e.max_gleanings < 0:
        raise UsageError("--max-gleanings must be 0 or more")
    if not [t for t in e.entity_types if t.strip()]:
        raise UsageError("--entity-types must name at least one type")


def settings_fingerprint(settings: Settings) -> str:
    """The extractor fingerprint stored in every record: what the extraction of a chunk depends on."""
    if extractor_kind(settings) == "rules":
        return RULES_FINGERPRINT
    from hrag_cli.extract.candidates import hint_source
    from hrag_cli.extract.llm_extractor import answer_format
    from hrag_cli.extract.prompts import HINTS_PROMPT_VERSION, JSON_PROMPT_VERSION, PROMPT_VERSION, SCHEMA_PROMPT_VERSION
    from hrag_cli.extract.schema import schema_of

    e = settings.extract
    schema = schema_of(e)
    # with a schema its types replace entity_types; without one the fingerprint is what it always was
    what = ([t.strip().lower() for t in e.entity_types],) if schema is None else \
        ([], SCHEMA_PROMPT_VERSION, schema.fingerprint)
    if answer_format(e, settings.llm) == "json":   # delimited fingerprints stay what they always were
        what = (*what, JSON_PROMPT_VERSION)
    if hint_source(e) != "none":                    # so are fingerprints without hints
        what = (*what, HINTS_PROMPT_VERSION, hint_source(e))
    digest = fingerprint(settings.llm.model, PROMPT_VERSION, *what,
                         e.language, e.max_gleanings, e.glean_min_tokens, settings.llm.temperature,
                         settings.llm.max_tokens, e.answer_tokens_min, e.answer_tokens_per_token)
    return f"llm:{settings.llm.model}:{digest[:16]}"


# ------------------------------------------------------------------------------------------- reading records


Latest = dict[tuple[str, str], Seen]     # (chunk_id, extractor) -> its latest record (cache_index.latest)


def _current_extractor(project: ProjectDir, chunks: list[Chunk] | None, default: str | None) -> str | None:
    """The extractor the project was last built with (manifest), else the one most chunks (read when None)
    have records from, else `default`."""
    stage = project.stage("extract")
    if stage and stage.counts.get("extractor"):
        return str(stage.counts["extractor"])
    ids = {c.chunk_id for c in (load_chunks(project) if chunks is None else chunks)}
    counter: Counter[str] = Counter()
    for (cid, ext) in cache_index.latest(project):
        if cid in ids:
            counter[ext] += 1
    if counter:
        return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return default


def current_extractor(project: ProjectDir) -> str | None:
    """The extractor whose records count now (see _current_extractor); None before any extraction."""
    return _current_extractor(project, None, None)


@dataclass
class CurrentRecords:
    """Where each current chunk's latest usable record of one extractor is in cache/extractions.jsonl. The
    cache is append-only, so an offset names one record for good: resolve compares them to tell which chunks'
    records changed since it last merged (resolve/state.py)."""

    chunks: dict[str, Any]  # chunk id -> its Chunk, or a records.ChunkRef when no text was read
    ids: list[str]          # chunk ids, ascending
    offsets: list[int]      # their records' byte offsets

    def only(self, ids: set[str]) -> "CurrentRecords":
        pick = [i for i, cid in enumerate(self.ids) if cid in ids]
        return CurrentRecords(self.chunks, [self.ids[i] for i in pick], [self.offsets[i] for i in pick])


def current_records(project: ProjectDir, extractor: str, chunks: Iterable[Any] | None = None) -> CurrentRecords:
    """Where each current chunk's latest record is, from the cache's index (usable: ok, or partial: a gleaning
    round was lost); chunks whose latest record is not usable are left out. `chunks`: chunks.jsonl's chunks
    (or their ChunkRefs), when the caller has read them already."""
    chunks = {ch.chunk_id: ch for ch in (load_chunks(project) if chunks is None else chunks)}
    at = cache_index.latest_offsets(project, extractor, USABLE)
    ids = sorted(cid for cid in at if cid in chunks)
    return CurrentRecords(chunks, ids, [at[cid] for cid in ids])


def iter_current_records(project: ProjectDir, extractor: str, current: CurrentRecords | None = None
                         ) -> Iterator[tuple[Chunk, ExtractionRecord]]:
    """Every current chunk with the latest usable record of `extractor` (or those of `current`), in chunk_id
    order; chunks without one are skipped. Records are read back one by one at their offsets, so memory does
    not grow with the extraction cache (on a large corpus, gigabytes as objects)."""
    current = current or current_records(project, extractor)
    for cid, rec in zip(current.ids, store.read_jsonl_at(project.extractions_path, current.offsets)):
        yield current.chunks[cid], ExtractionRecord.from_json(rec)


def iter_current_extractions(project: ProjectDir) -> Iterator[ExtractionRecord]:
    """For every chunk in chunks.jsonl, the latest usable record of the extractor recorded in the manifest's
    extract stage, one at a time in chunk_id order, as extracted (prune.iter_pruned is what resolve reads).
    Chunks without one are simply absent."""
    extractor = current_extractor(project)
    if extractor is not None:
        yield from (rec for _, rec in iter_current_records(project, extractor))


def load_current_extractions(project: ProjectDir) -> dict[str, ExtractionRecord]:
    """iter_current_extractions as a dict by chunk id."""
    return {rec.chunk_id: rec for rec in iter_current_extractions(project)}


# ------------------------------------------------------------------------------------------- the stage


def _summary_counts(chunks: list[Chunk], latest: Latest, extractor: str) -> tuple[dict, str]:
    failed = partial = pending = ents = rels = dropped = retyped = truncated = 0
    digest_items = []
    for ch in chunks:
        rec = latest.get((ch.chunk_id, extractor))
        if rec is None:
            pending += 1
            continue
        digest_items.append((ch.chunk_id, rec.digest))
        dropped += sum(rec.dropped.values())
        truncated += rec.dropped.get("truncated", 0)
        retyped += rec.retyped
        if rec.status not in USABLE:
            failed += 1
            continue
        partial += rec.status == "partial"
        ents += rec.entities
        rels += rec.relations
    digest_items.sort()
    counts = {"failed": failed, "partial": partial, "pending": pending, "entity_mentions": ents,
              "relation_mentions": rels, "dropped_rows": dropped, "retyped": retyped, "truncated_rows": truncated}
    return counts, fingerprint(extractor, digest_items)


def run_extract(project: ProjectDir, settings: Settings, reporter: Reporter, *, reparse: bool = False,
                retry_failed: bool = False, max_cost: float | None = None,
                import_openie: Path | None = None, imported: Any = None,
                chunks: list[Chunk] | None = None, added: bool = False) -> StageOutcome:
    """Extract every current chunk that has no record for the current extractor (plus failed ones with
    `retry_failed`); `reparse` first rebuilds existing LLM records from cached answers. Raises
    BudgetExceeded after saving everything finished when the run's spend reaches `max_cost`. `chunks`: what
    the chunk stage just wrote to chunks.jsonl, when the caller has it; `added`: only the chunks it appended,
    the stage's record having covered every other one when the run began. Only the chunks appended since the
    files the record covered (its chunk mark, else `added`) are looked at, when that is all that changed."""
    if not (reparse or retry_failed or import_openie is not None or imported is not None):
        prev = project.stage("extract")
        since = _chunks_since(project, prev) if prev is not None else None
        if since is None and added:
            since = chunks or []
        outcome = _extract_added(project, settings, reporter, prev, since, max_cost) if since is not None else None
        if outcome is not None:
            return outcome
    chunks = load_chunks(project) if chunks is None or added else chunks
    imported_counts: dict[str, Any] = {}
    if import_openie is not None:
        extractor, imported_counts = _import(project, chunks, Path(import_openie), reporter)
        kind = "openie"
    elif imported is not None:   # an extract.imported.ImportSource
        extractor, imported_counts = _import_corpus(project, chunks, imported, reporter)
        kind = imported.kind
    else:
        kind = extractor_kind(settings)
        extractor = settings_fingerprint(settings)
    latest = cache_index.latest(project, {extractor})
    try:
        counts, budget = _extract(project, settings, reporter, kind, extractor, chunks, latest, max_cost,
                                  reparse=reparse, retry_failed=retry_failed)
    except (RunStopped, Interrupted) as exc:
        exc.counts = {**exc.counts, **_summary_counts(chunks, latest, extractor)[0]}
        raise
    summary, digest = _summary_counts(chunks, latest, extractor)
    counts.update(summary)
    counts.update(cache_mark=_cache_size(project), chunk_mark=chunk_mark(project))
    if kind == "openie":
        # chunks the file has no passage for are not resumable work: they just have no extraction
        counts["unmatched"] = counts.pop("pending")
        counts["pending"] = 0
        counts.update({f"openie_{k}": v for k, v in imported_counts.items()})
        counts["openie_file"] = str(Path(import_openie).resolve())   # a later plain `hrag index` re-imports it
    if imported is not None:   # a chunk the import gives no rows has nothing to extract later either
        counts["without_extraction"] = counts.pop("pending")
        counts["pending"] = 0
        counts.update({f"{kind}_{k}": v for k, v in imported_counts.items()})
    if budget is not None:
        raise budget
    if counts["failed"] or counts["partial"]:
        reporter.warn(failure_summary(project, chunks, latest, extractor, counts))
    return StageOutcome(counts=counts, output_digest=digest)


def _extract(project: ProjectDir, settings: Settings, reporter: Reporter, kind: str, extractor: str,
             chunks: list[Chunk], latest: Latest, max_cost: float | None, *, reparse: bool = False,
             retry_failed: bool = False) -> tuple[dict[str, Any], BudgetExceeded | None]:
    """Extract those of `chunks` that need it (`latest`: their records so far, kept up to date); this run's
    counts, and the budget stop to raise once what was finished is counted."""
    counts: dict[str, Any] = {"extractor": extractor, "chunks": len(chunks), "extracted_now": 0, "cached": 0,
                              "failed": 0, "pending": 0, "llm_requests": 0, "llm_cache_hits": 0, "retries": 0,
                              "prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
    todo: list[Chunk] = []
    attempts: dict[str, dict] = {}
    seen: set[str] = set()
    for ch in chunks:
        if ch.chunk_id in seen:
            continue
        seen.add(ch.chunk_id)
        rec = latest.get((ch.chunk_id, extractor))
        if rec is None or (retry_failed and rec.status != "ok"):
            todo.append(ch)
            if rec is not None:
                attempts[ch.chunk_id] = _retry_args(full_record(project, rec))
        else:
            counts["cached"] += 1
    if kind == "llm":
        _note_schema_change(project, settings, counts, reporter, len(todo) if not reparse else 0)
    budget: BudgetExceeded | None = None
    cluster = _cluster(project, settings, reporter) if todo else None
    if kind == "rules":
        _run_rules(project, todo, latest, reporter, counts, cluster)
    elif kind == "llm" and (todo or reparse):
        with _llm_client(project, settings, max_cost, reporter, cluster) as client:
            try:
                if reparse:
                    from hrag_cli.extract.llm_extractor import answer_format, frame_of

                    frame = frame_of(settings.extract, answer_format(settings.extract, settings.llm))
                    created = _reparse(project, client, chunks, latest, extractor, reporter, counts, frame)
                    todo = [ch for ch in todo if ch.chunk_id not in created]
                    counts["cached"] += len(created)
                if todo:
                    client.run(lambda: _run_llm(project, client, todo, settings, extractor, latest, reporter,
                                                counts, attempts))
            except BudgetExceeded as exc:
                budget = exc
            except (RunStopped, Interrupted) as exc:
                exc.counts = counts      # filled in below: the caller reports what the run did
                raise
            finally:
                st = client.stats
                counts.update(llm_requests=st.requests, llm_cache_hits=st.cache_hits, retries=st.retries,
                              prompt_tokens=st.prompt_tokens, completion_tokens=st.completion_tokens,
                              cost=round(st.cost, 6))
    return counts, budget


@dataclass
class _Cluster:
    ray: Any        # the ray module, connected
    nodes: int


def _cluster(project: ProjectDir, settings: Settings, reporter: Reporter) -> _Cluster | None:
    """The Ray cluster this run extracts on ([cluster] ray, --ray), checked to share the project directory;
    None for this process only (Ray is then never imported)."""
    from hrag_cli import cluster

    if not cluster.wanted(settings.cluster.ray):
        return None
    ray = cluster.connect(settings.cluster.ray)
    nodes = cluster.check_shared(ray, project.root)
    reporter.info(f"extracting on the Ray cluster at {settings.cluster.ray} ({nodes} node(s))")
    return _Cluster(ray, nodes)


def _llm_client(project: ProjectDir, settings: Settings, max_cost: float | None, reporter: Reporter,
                cluster: _Cluster | None) -> Any:
    """The run's LLM client (it reads the whole response cache: made only when there is work); on a cluster
    its requests leave from the cluster's nodes under one cap (cluster/ray_llm.py)."""
    if cluster is None:
        from hrag_cli.core.llm import LLMClient

        return LLMClient(project, settings.llm, max_cost=max_cost, reporter=reporter)
    from hrag_cli.cluster.ray_llm import cluster_client
    from hrag_cli.extract.llm_extractor import extract_chunk, first_request

    return cluster_client(cluster.ray, project, settings.llm, cluster.nodes, extract_chunk=extract_chunk,
                          first_request=first_request, max_cost=max_cost, reporter=reporter)


SUMMED = ("failed", "partial", "pending", "entity_mentions", "relation_mentions", "dropped_rows", "retyped",
          "truncated_rows")     # _summary_counts' totals over every current chunk


def _extract_added(project: ProjectDir, settings: Settings, reporter: Reporter, prev: StageRecord | None,
                   chunks: list[Chunk], max_cost: float | None) -> StageOutcome | None:
    """The stage when the chunk stage only appended `chunks`: the record's totals and digest carried on with
    theirs (O(new chunks)). None when the record cannot vouch for the other chunks any more: it is not this
    extractor's, or a record of some other chunk may have been appended since it was made (a stopped
    --retry-failed run): the caller then looks at every chunk. `prev`: the stage's record."""
    kind = extractor_kind(settings)
    extractor = settings_fingerprint(settings)
    if (prev is None or kind not in ("rules", "llm") or prev.counts.get("extractor") != extractor
            or prev.counts.get("pending") or not isinstance(prev.counts.get("chunks"), int)):
        return None
    mark, size = _mark(prev), _cache_size(project)
    ids = {ch.chunk_id for ch in chunks}
    if size < mark or (size > mark and not _only_new_since(project, extractor, mark, ids)):
        return None
    latest = cache_index.latest(project, {extractor}, ids) if ids else {}
    try:
        counts, budget = _extract(project, settings, reporter, kind, extractor, chunks, latest, max_cost)
    except (RunStopped, Interrupted) as exc:    # the pending count of the chunks this run was given
        exc.counts = {**exc.counts, **_summary_counts(chunks, latest, extractor)[0]}
        raise
    summary, digest = _summary_counts(chunks, latest, extractor)
    counts["chunks"] += prev.counts["chunks"]
    counts["cached"] += prev.counts["chunks"]
    counts.update({k: int(prev.counts.get(k, 0)) + summary[k] for k in SUMMED})
    counts.update(cache_mark=_cache_size(project), chunk_mark=chunk_mark(project))
    if budget is not None:
        raise budget
    if counts["failed"] or counts["partial"]:
        every = load_chunks(project)
        reporter.warn(failure_summary(project, every, cache_index.latest(project, {extractor}), extractor, counts))
    return StageOutcome(counts=counts, output_digest=fingerprint("extract-append", prev.output_digest, digest)
                        if chunks else prev.output_digest)


def _cache_size(project: ProjectDir) -> int:
    try:
        return project.extractions_path.stat().st_size
    except FileNotFoundError:
        return 0


def _mark(rec: StageRecord) -> int:
    """How long the extraction cache was when the stage's record was made (0: a record from before marks)."""
    mark = rec.counts.get("cache_mark")
    return mark if isinstance(mark, int) and mark > 0 else 0


def _only_new_since(project: ProjectDir, extractor: str, mark: int, new: set[str]) -> bool:
    """No record of `extractor` appended after byte `mark` can have replaced the record the stage counted for a
    chunk other than the `new` ones: each is its chunk's first record of that extractor (a chunk the stage
    counted had one before the mark)."""
    had: set[str] = set()
    for e in cache_index.entries(project):
        cid = e[3]
        if cid is None or e[4] != extractor:
            continue
        if e[0] >= mark and cid in had and cid not in new:
            return False
        had.add(cid)
    return True


def taken_ids(project: ProjectDir, current: bool) -> Callable[[set[str]], bool] | None:
    """For the chunk stage's append (chunk.stage.run_chunk): whether any of these ids may be a chunk's in
    chunks.jsonl. Every chunk the extract stage's record covered (the files up to its chunk mark, or all of them
    when `current`: the record was made over the chunks the files hold) had a record in the extraction cache
    before its cache mark (nothing pending, none unmatched), and those appended since are known, so an id that
    is neither is no chunk's. None when the record cannot say."""
    prev = project.stage("extract")
    if prev is None or prev.counts.get("pending") or prev.counts.get("unmatched"):
        return None
    since = _chunks_since(project, prev)
    if since is None and not current:
        return None
    appended = {ch.chunk_id for ch in since or []}
    mark = _mark(prev)

    def taken(ids: set[str]) -> bool:
        return bool(ids & appended) or any(e[3] in ids for e in cache_index.entries(project)
                                            if not mark or e[0] < mark)

    return taken


def _chunks_since(project: ProjectDir, prev: StageRecord) -> list[Chunk] | None:
    """The chunks appended to chunks.jsonl since the files the stage's record covered (None: it kept no mark,
    or the files were written whole since)."""
    added = added_since(project, prev.counts.get("chunk_mark"))
    return None if added is None else added[1]


def _note_schema_change(project: ProjectDir, settings: Settings, counts: dict, reporter: Reporter, todo: int) -> None:
    """Record the schema's fingerprint; when it differs from the last run's and chunks are about to be asked
    again because of it, say so in one line (a schema is a build setting: never changed without a word)."""
    from hrag_cli.extract.schema import schema_of

    schema = schema_of(settings.extract)
    if schema is None:
        return
    counts["schema_fingerprint"] = schema.fingerprint
    prev = project.stage("extract")
    before = prev.counts.get("schema_fingerprint") if prev else None
    if todo and before and before != schema.fingerprint:
        reporter.info(f"the schema {schema.path} changed since the last run: {todo} chunk(s) are extracted with "
                      "its new prompt ('hrag index --reparse' re-reads the cached answers instead)")


def _retry_args(rec: dict) -> dict:
    """extract_chunk's arguments for --retry-failed. A failed chunk is asked anew (attempt + 1: a changed
    request, so not the cached unreadable answer). A partial one repeats its own attempt, whose answers so far
    are in the response cache, so only what is missing goes to the network: the lost round, or, for an answer
    still cut at max_tokens, further continuation rounds (never the identical cut request again)."""
    from hrag_cli.extract.llm_extractor import CONTINUATIONS

    attempt = _int(rec.get("attempt", 1)) or 1
    if rec.get("status") != "partial":
        return {"attempt": attempt + 1}
    if rec.get("error_kind") == "truncated":
        return {"attempt": attempt, "continuations": _int(rec.get("continuations")) + CONTINUATIONS}
    return {"attempt": attempt}


def failure_summary(project: ProjectDir, chunks: list[Chunk], latest: Latest, extractor: str, counts: dict) -> str:
    """One line for the end of a run with failed or partial chunks: how many, the commonest error, the fix."""
    errors: Counter[str] = Counter()
    for ch in chunks:
        seen = latest.get((ch.chunk_id, extractor))
        if seen is not None and seen.status != "ok":
            rec = full_record(project, seen)
            errors[str(rec.get("error") or rec.get("status"))[:160]] += 1
    parts = []
    if counts["failed"]:
        parts.append(f"{counts['failed']} of {len(chunks)} chunk(s) could not be extracted")
    if counts["partial"]:
        parts.append(f"{counts['partial']} only partly extracted (a round lost, or the answer still cut)")
    common, n = errors.most_common(1)[0] if errors else ("", 0)
    return (f"{' and '.join(parts)} (commonest, {n}x: {common}); 'hrag status' lists them, "
            "'hrag index --retry-failed' tries them again")


RULES_BATCH = 256          # chunks per job of the forked rules extractor
RULES_PARALLEL_MIN = 2048  # fewer chunks than this are extracted in this process (a pool costs a fork)


def _rules_of(chunks: list[Chunk]) -> list[dict]:
    return [extract_rules(ch.chunk_id, ch.text).to_json() for ch in chunks]


def _rules_batch(todo: list[Chunk], span: tuple[int, int]) -> list[dict]:
    return _rules_of(todo[span[0]:span[1]])


RULES_WINDOW_PER_NODE = 8   # batches in flight per node on a cluster: enough to keep its cores busy


def _run_rules(project: ProjectDir, todo: list[Chunk], latest: Latest, reporter: Reporter,
               counts: dict, cluster: _Cluster | None = None) -> None:
    """The rules extractor over `todo`, RULES_BATCH chunks per job in one forked worker per core (pure Python:
    one core would do a large folder alone), or as Ray tasks across a cluster; records are appended in `todo`
    order, as one process would."""
    if not todo:
        return
    spans = ranges(len(todo), RULES_BATCH)
    if cluster is not None:
        from hrag_cli.cluster import ordered_map

        jobs = ordered_map(cluster.ray, _rules_of, (todo[a:b] for a, b in spans),
                           RULES_WINDOW_PER_NODE * cluster.nodes)
    else:
        jobs = forked_map(_rules_batch, todo, spans, parallel=len(todo) >= RULES_PARALLEL_MIN)
    with store.JsonlAppender(project.extractions_path) as out, reporter.task("extract", len(todo)) as task:
        for recs in jobs:
            for rec in recs:
                latest[(rec["chunk_id"], rec["extractor"])] = seen_of(rec, out.append(rec))
            counts["extracted_now"] += len(recs)
            task.advance(len(recs))


def _stats(client: Any) -> dict:
    st = client.stats
    return {"llm_calls": st.requests, "tokens": st.prompt_tokens + st.completion_tokens, "cost": float(st.cost)}


class _Streak:
    """Failed records whose cause may be run-wide (context too small, timeouts, server errors), held back
    until a later chunk shows it is not: `STREAK` in a row for one cause stop the run with those chunks still
    pending, as a run-level cause (no server, bad key) does at once."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.kind = ""
        self.held: list[dict] = []

    @staticmethod
    def kind_of(rec: dict) -> str:
        kind = rec.get("error_kind", "") if rec.get("status") == "failed" else ""
        return kind if kind in STREAK_KINDS else ""

    def add(self, rec: dict) -> list[dict]:
        """Take a finished chunk's record; return the records to write now (`rec` itself unless held, plus
        the held ones once a different outcome shows their cause was not run-wide)."""
        kind = self.kind_of(rec)
        out = self.release() if kind != self.kind else []
        if not kind:
            return [*out, rec]
        self.kind = kind
        self.held.append(rec)
        return out

    def release(self) -> list[dict]:
        out, self.held, self.kind = self.held, [], ""
        return out

    @property
    def full(self) -> bool:
        return len(self.held) >= self.limit


async def _run_llm(project: ProjectDir, client: Any, todo: list[Chunk], settings: Settings, extractor: str,
                   latest: Latest, reporter: Reporter, counts: dict,
                   attempts: dict[str, dict]) -> None:
    """Schedule every chunk, a bounded window at a time (the client bounds requests in flight), and save
    each record as soon as its chunk completes. A run-wide failure (llm.FailureCause) stops the run with
    RunStopped, one line naming cause and fix; the chunks it hit stay pending."""
    from hrag_cli.core.llm_retry import FailureCause, LLMError, failure_cause
    from hrag_cli.extract.llm_extractor import extract_chunk

    from hrag_cli.core.llm_retry import is_local

    # chunks started ahead of a free request slot keep a remote API busy; a server on this machine answers one
    # at a time, and a chunk queued there would be sent before a run-wide stop (a streak) is seen
    window = max(1, client.settings.concurrency) * (1 if is_local(client.settings) else 2)
    # a cluster's client extracts whole chunks on its nodes (cluster/ray_llm.py); otherwise this process does
    extract = getattr(client, "extract_chunk", None) or functools.partial(extract_chunk, client)
    queue = iter(todo)
    running: dict[asyncio.Task, Chunk] = {}
    budget: BudgetExceeded | None = None
    stop: str = ""
    fix: str = ""
    streak = _Streak(min(STREAK, len(todo)))

    def save(rec: dict) -> None:
        latest[(rec["chunk_id"], extractor)] = seen_of(rec, out.append(rec))
        counts["extracted_now"] += 1

    with store.JsonlAppender(project.extractions_path) as out, reporter.task("extract", len(todo)) as task:
        try:
            while not stop:
                while budget is None and len(running) < window:
                    ch = next(queue, None)
                    if ch is None:
                        break
                    running[asyncio.ensure_future(
                        extract(ch, settings.extract, extractor, **attempts.get(ch.chunk_id, {})))] = ch
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    running.pop(fut)
                    try:
                        rec = fut.result().to_json()
                    except BudgetExceeded as exc:
                        budget = budget or exc
                        continue
                    except LLMError as exc:
                        cause = failure_cause(exc, client.settings)
                        if cause is None:
                            raise
                        if not stop:
                            stop, fix = cause.explain(exc), cause.fix
                        continue
                    task.advance(1, **_stats(client))
                    if stop:              # stopping: what the streak holds stays pending
                        if not streak.kind_of(rec):
                            save(rec)
                        continue
                    for done_rec in streak.add(rec):
                        save(done_rec)
                    if streak.full:
                        first = streak.held[0]
                        stop = f"{len(streak.held)} chunks in a row failed ({first.get('error', '')})"
                        fix = FailureCause(streak.kind, False, '', client.settings.model).fix
            if not stop:
                for held in streak.release():
                    save(held)
        finally:
            for fut in running:
                fut.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
    if budget is not None:
        raise budget
    if stop:
        left = len(todo) - counts["extracted_now"]
        raise RunStopped(f"extraction stopped with {left} chunk(s) left to do: {stop}; {fix}", cause=stop, fix=fix)


def _reparse(project: ProjectDir, client: Any, chunks: list[Chunk], latest: Latest,
             extractor: str, reporter: Reporter, counts: dict, frame: Any) -> set[str]:
    """Re-parse every current chunk's cached answers with today's parser, checks and schema; no network call.
    A chunk with no record for this extractor (the schema or a prompt setting changed) is rebuilt from the
    answers of its latest record by another extractor of the same model, so `--reparse` after a schema change
    asks nothing; returns those chunks' ids."""
    from hrag_cli.extract.llm_extractor import reparse_chunk

    missing_ids = {ch.chunk_id for ch in chunks if (ch.chunk_id, extractor) not in latest}
    earlier = _earlier_llm_records(project, missing_ids, extractor) if missing_ids else {}
    reparsed = changed = missing = 0
    created: set[str] = set()
    with store.JsonlAppender(project.extractions_path) as out:
        for ch in chunks:
            seen = latest.get((ch.chunk_id, extractor))
            old = full_record(project, seen) if seen is not None else earlier.get(ch.chunk_id)
            if old is None or ch.chunk_id in created:
                continue
            new = reparse_chunk(client, ch, ExtractionRecord.from_json(old), frame, extractor)
            if new is None:
                missing += 1
                continue
            reparsed += 1
            rec = new.to_json()
            if rec != old:
                latest[(ch.chunk_id, extractor)] = seen_of(rec, out.append(rec))
                changed += 1
            if old.get("extractor") != extractor:
                created.add(ch.chunk_id)
    counts.update(reparsed=reparsed, reparse_changed=changed, reparse_missing=missing,
                  reparse_from_earlier=len(created))
    reporter.info(f"re-parsed {reparsed} chunk(s) from cached answers, {changed} changed"
                  + (f", {len(created)} from an earlier extractor's answers" if created else "")
                  + (f", {missing} without cached answers" if missing else ""))
    return created


def _earlier_llm_records(project: ProjectDir, chunk_ids: set[str], extractor: str) -> dict[str, dict]:
    """chunk_id -> the latest record with cached answers written by another extractor of the same LLM (the
    extractor ids of one model differ only in their settings digest: llm:MODEL:DIGEST)."""
    model = extractor.rsplit(":", 1)[0] + ":"
    out: dict[str, dict] = {}
    for rec in store.read_jsonl(project.extractions_path):
        if (isinstance(rec, dict) and rec.get("chunk_id") in chunk_ids and rec.get("llm_keys")
                and str(rec.get("extractor", "")).startswith(model) and rec.get("extractor") != extractor):
            out[rec["chunk_id"]] = rec
    return out


def _import(project: ProjectDir, chunks: list[Chunk], path: Path, reporter: Reporter) -> tuple[str, dict]:
    """--import-openie: take HippoRAG's OpenIE results as this project's extractions (the importer names
    the extractor after the file's content, so a changed file replaces the records)."""
    if not path.is_file():
        raise UsageError(f"--import-openie: no such file: {path}")
    from hrag_cli.extract.openie import import_openie, openie_extractor_id

    extractor = openie_extractor_id(path)
    records, counts = import_openie(project, chunks, path, reporter)
    _append_imported(project, extractor, records)
    return extractor, counts


def _import_corpus(project: ProjectDir, chunks: list[Chunk], source: Any, reporter: Reporter) -> tuple[str, dict]:
    """--import-lightrag / --import-graphrag: the folder's extractions as this project's, for the chunks the
    chunk stage imported from it."""
    from hrag_cli.extract.importers import importer

    mod = importer(source.kind)
    path = mod.check_dir(source.path)
    corpus = mod.read_corpus(path)
    mine = {ch.chunk_id for ch in chunks}
    extractor, records, counts = mod.import_records(path, corpus, reporter)
    _append_imported(project, extractor, [r for r in records if r.chunk_id in mine])
    return extractor, counts


def _append_imported(project: ProjectDir, extractor: str, records: list[ExtractionRecord]) -> None:
    """Imported records not already there as they are, appended to the extraction records."""
    existing = cache_index.latest(project, {extractor})
    with store.JsonlAppender(project.extractions_path) as out:
        for rec in records:
            rec.extractor = extractor
            data = rec.to_json()
            seen = existing.get((rec.chunk_id, extractor))
            if seen is None or seen.digest != fingerprint(data):
                out.append(data)


# ------------------------------------------------------------------------------------------------- status


def extraction_status(project: ProjectDir, settings: Settings) -> dict:
    """For `hrag status`: extraction counts and the failed chunks with their document paths."""
    chunks = load_chunks(project)
    try:
        default = settings_fingerprint(settings)
    except UsageError:
        default = None
    extractor = _current_extractor(project, chunks, default)
    if extractor is None:
        return {"extraction": {"chunks": len(chunks)}, "failed_chunks": []}
    latest = cache_index.latest(project, {extractor})
    counts, _ = _summary_counts(chunks, latest, extractor)
    paths = {r.get("doc_id"): r.get("path") for r in store.read_jsonl(project.docs_path) if isinstance(r, dict)}
    failed: list[dict] = []
    dropped: list[dict] = []
    totals: dict[str, int] = {}
    older = 0
    for ch in chunks:
        rec = latest.get((ch.chunk_id, extractor))
        if rec is None:
            continue
        where = {"chunk_id": ch.chunk_id, "path": paths.get(ch.doc_id, ch.doc_id), "order": ch.order}
        if rec.status != "ok":
            failed.append({**where, "status": rec.status, "error": full_record(project, rec).get("error", "")})
        if rec.dropped:
            dropped.append({**where, "dropped": rec.dropped})
            add_counts(totals, rec.dropped)
        if rec.llm_keys and rec.parser < PARSER_VERSION:
            older += 1
    info = {"extraction": {"extractor": extractor, "chunks": len(chunks),
                           "extracted": len(chunks) - counts["pending"], **counts},
            "failed_chunks": failed, "dropped_by_reason": totals, "dropped_chunks": dropped}
    if older:
        info["reparse"] = (f"{older} chunk(s) were read by an older parser; 'hrag index --reparse' re-reads "
                           f"their cached answers without calling the model")
    return info


def iter_dropped(status: dict) -> Iterable[str]:
    """One line per chunk with dropped rows, for the plain `hrag status` output."""
    for d in status.get("dropped_chunks", []):
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(d["dropped"].items()))
        yield f"{d['path']} chunk {d['order']} ({d['chunk_id'][:12]}): {reasons}"


def iter_failed(status: dict) -> Iterable[str]:
    """One line per failed chunk, for the plain `hrag status` output."""
    for f in status.get("failed_chunks", []):
        state = "" if f.get("status", "failed") == "failed" else f" [{f['status']}]"
        yield f"{f['path']} chunk {f['order']} ({f['chunk_id'][:12]}){state}: {f['error']}"

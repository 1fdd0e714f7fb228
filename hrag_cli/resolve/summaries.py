"""Merged descriptions of entities and relations: joined fragments, or an LLM summary (map-reduce when long).

Why a separate cache (cache/summaries.jsonl) on top of the LLM response cache: one summary can take several
requests (map-reduce), and its key (kind, name, fragments, model, target tokens, prompt version) lets resolve
skip the whole job for an unchanged entity without rebuilding any prompt. Entries are appended as each summary
finishes, so a run stopped by the budget or an error keeps what it paid for.
"""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hrag_cli.core import interrupt, store
from hrag_cli.chunk.chunking import count_tokens, get_encoder
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, fingerprint

# Tokens kept free for the chat template and rounding, on top of the measured prompt overhead.
_MARGIN_TOKENS = 64


def summary_prompt_version() -> str:
    """A hash of the summary prompt wording itself, so editing the prompt makes every cached summary stale
    without anyone remembering to bump a constant."""
    from hrag_cli.extract.prompts import build_summary_messages

    return fingerprint("summary-prompt", build_summary_messages("entity", "N", ["F"], 100, "L"),
                       build_summary_messages("relation", "N", ["F"], 100, "L"))


def truncate_tokens(text: str, n: int) -> str:
    """The first `n` tokens of `text` (whole text when shorter)."""
    enc = get_encoder()
    toks = enc.encode(text, disallowed_special=())
    if len(toks) <= n:
        return text
    return enc.decode(toks[:max(n, 0)]).rstrip()


def dedupe(fragments: dict[str, int]) -> list[str]:
    """Distinct non-empty fragments, sorted: the canonical order for joining and for the summary key."""
    return sorted(f for f in fragments if f)


def by_frequency(fragments: dict[str, int], limit: int | None = None) -> list[str]:
    """Most frequent first, ties in text order: what survives when the description must be cut. With
    `limit`, only that many (a partial selection: a popular entity can have a huge number of fragments)."""
    items = ((-c, f) for f, c in fragments.items() if f)
    if limit is not None and limit < len(fragments):
        return [f for _, f in heapq.nsmallest(limit, items)]
    return [f for _, f in sorted(items)]


@lru_cache(maxsize=1 << 16)
def _fragment_tokens(fragment: str) -> int:
    return count_tokens(fragment)


@dataclass
class SummaryJob:
    """One description that crossed a threshold while an LLM is configured."""

    kind: str             # "entity" or "relation"
    name: str             # display name ("A and B" for a relation)
    fragments: list[str]  # de-duplicated, sorted
    key: str = ""


class Summarizer:
    """Decides per item between joining and summarising, and runs the LLM jobs with the summary cache."""

    def __init__(self, project: ProjectDir, settings: Settings, reporter: Reporter | None = None) -> None:
        self.project = project
        self.settings = settings
        self.rs = settings.resolve
        self.reporter = reporter or Reporter("quiet")
        self.enabled = bool(settings.llm.model)
        self.model = settings.llm.model
        self.language = settings.extract.language
        self.llm_calls = 0          # requests that reached the model (not served by cache/llm.jsonl)
        self.llm_cache_hits = 0     # requests served by cache/llm.jsonl
        self.cached = 0             # jobs served whole by cache/summaries.jsonl
        self.summarised = 0         # jobs that needed an LLM summary this run
        self._prompt_version = summary_prompt_version() if self.enabled else ""
        self._cache: dict[str, str] | None = None
        self._sep_tokens: int | None = None

    # -- deciding ---------------------------------------------------------------------------------------
    def needs_summary(self, fragments: list[str]) -> bool:
        """Count threshold, else token threshold. UTF-8 length bounds the token count from above, so the
        tokenizer only runs for the rare long descriptions (this keeps millions of mentions fast)."""
        if len(fragments) >= self.rs.summary_min_fragments:
            return True
        sep = self.rs.description_separator
        limit = self.rs.summary_max_input_tokens
        if sum(len(f.encode("utf-8")) for f in fragments) + len(sep.encode("utf-8")) * len(fragments) <= limit:
            return False
        return count_tokens(sep.join(fragments)) > limit

    def joined(self, fragments: list[str]) -> str:
        return self.rs.description_separator.join(fragments)

    def fallback(self, counts: dict[str, int]) -> str:
        """No LLM: whole fragments, most frequent first, while they fit summary_target_tokens (so a
        description is never longer than a summary would be); a first fragment that alone is too long is cut.
        Candidates are selected 64 at a time first: a popular entity can have a huge number of fragments, and a full
        selection of budget + 1 (each costs at least one token) is needed only when 64 did not fill it. A
        fragment's token count is kept (`_fragment_tokens`): the rules extractor makes a sentence the description
        of every name and pair in it, so the same fragments come back for entity after entity."""
        budget = self.rs.summary_target_tokens
        sep = self.rs.description_separator
        if self._sep_tokens is None:
            self._sep_tokens = count_tokens(sep) if sep else 0
        for limit in (min(64, budget + 1), budget + 1):
            candidates = by_frequency(counts, limit=limit)
            kept: list[str] = []
            used = 0
            full = False
            for frag in candidates:
                extra = _fragment_tokens(frag) + (self._sep_tokens if kept else 0)
                if used + extra > budget:
                    if not kept:
                        kept.append(truncate_tokens(frag, budget))
                    full = True
                    break
                kept.append(frag)
                used += extra
            if full or len(candidates) < limit:
                break
        return sep.join(kept)

    def describe(self, kind: str, name: str, counts: dict[str, int]) -> str | SummaryJob:
        """The final description, or a job for `run` when the LLM must summarise it."""
        if not self.enabled and len(counts) >= self.rs.summary_min_fragments:
            return self.fallback(counts)  # decided by the count alone: skip sorting every fragment
        fragments = dedupe(counts)
        if not fragments:
            return ""
        if not self.needs_summary(fragments):
            return self.joined(fragments)
        if not self.enabled:
            return self.fallback(counts)
        return SummaryJob(kind, name, fragments, self.job_key(kind, name, fragments))

    def job_key(self, kind: str, name: str, fragments: list[str]) -> str:
        return fingerprint("summary", kind, name, fragments, self.model, self.rs.summary_target_tokens,
                           self._prompt_version, self.language, self.settings.llm.context_tokens)

    # -- running ----------------------------------------------------------------------------------------
    def _load_cache(self) -> dict[str, str]:
        if self._cache is None:
            self._cache = {}
            for rec in store.read_jsonl(self.project.summaries_path):
                if isinstance(rec, dict) and isinstance(rec.get("key"), str) and isinstance(rec.get("summary"), str):
                    self._cache[rec["key"]] = rec["summary"]
        return self._cache

    def run(self, jobs: list[SummaryJob]) -> dict[str, str]:
        """Summaries by job key: cached ones straight away, the rest through the LLM (concurrently; the
        client bounds requests in flight)."""
        cache = self._load_cache()
        out: dict[str, str] = {}
        todo: list[SummaryJob] = []
        seen: set[str] = set()
        for job in jobs:
            if job.key in cache:
                out[job.key] = cache[job.key]
                self.cached += 1
            elif job.key not in seen:
                seen.add(job.key)
                todo.append(job)
        if todo:
            out.update(interrupt.run(lambda: self._run_llm(todo)))
        return out

    async def _run_llm(self, jobs: list[SummaryJob]) -> dict[str, str]:
        from hrag_cli.core.llm import LLMClient

        client = LLMClient(self.project, self.settings.llm, reporter=self.reporter)
        results: dict[str, str] = {}
        appender = store.JsonlAppender(self.project.summaries_path)
        try:
            with self.reporter.task("summaries", len(jobs)) as task:
                async def one(job: SummaryJob) -> None:
                    text = await self._summarise(client, job)
                    results[job.key] = text
                    self.summarised += 1
                    assert self._cache is not None
                    self._cache[job.key] = text
                    appender.append({"key": job.key, "kind": job.kind, "name": job.name, "summary": text,
                                     "model": self.model, "target_tokens": self.rs.summary_target_tokens,
                                     "fragments": len(job.fragments)})
                    task.advance(1, llm_calls=self.llm_calls)

                await asyncio.gather(*(one(j) for j in jobs))
        finally:
            appender.close()
            await client.aclose()
            client.close()
        return results

    def _budget(self, job: SummaryJob) -> int:
        """Fragment tokens one request may carry: context minus the prompt itself and the answer."""
        from hrag_cli.extract.prompts import build_summary_messages

        target = self.rs.summary_target_tokens
        overhead = sum(count_tokens(m["content"]) for m in
                       build_summary_messages(job.kind, job.name, [], target, self.language))
        budget = self.settings.llm.context_tokens - overhead - target - _MARGIN_TOKENS
        if budget < 2 * max(target // 4, 32):
            raise UsageError(f"llm.context_tokens={self.settings.llm.context_tokens} leaves no room to summarise "
                             f"descriptions of up to resolve.summary_target_tokens={target}; raise the first or "
                             f"lower the second")
        return budget

    async def _call(self, client: Any, job: SummaryJob, fragments: list[str]) -> str:
        from hrag_cli.extract.prompts import build_summary_messages

        target = self.rs.summary_target_tokens
        messages = build_summary_messages(job.kind, job.name, fragments, target, self.language)
        resp = await client.achat(messages, max_tokens=2 * target, purpose=f"summary:{job.kind}")
        if resp.cached:
            self.llm_cache_hits += 1
        else:
            self.llm_calls += 1
        text = " ".join(resp.text.split())
        # an empty answer must not wipe the description: keep the fragments joined instead
        return text or self.joined(fragments)

    async def _summarise(self, client: Any, job: SummaryJob) -> str:
        """Map-reduce: pack fragments into groups that fit the request budget, summarise each, repeat on the
        partial summaries until one request holds them all. Partials are capped at half the budget, so each
        round at least halves the number of pieces and the loop ends."""
        budget = self._budget(job)
        pieces = [truncate_tokens(f, budget) for f in job.fragments]
        sizes = [count_tokens(p) for p in pieces]
        sep_tokens = 2  # "- " bullet and newline per fragment in the prompt
        while True:
            if sum(sizes) + sep_tokens * len(sizes) <= budget:
                return await self._call(client, job, pieces)
            groups: list[list[str]] = [[]]
            used = 0
            for piece, size in zip(pieces, sizes):
                if groups[-1] and used + size + sep_tokens > budget:
                    groups.append([])
                    used = 0
                groups[-1].append(piece)
                used += size + sep_tokens
            partials = await asyncio.gather(*(self._call(client, job, g) for g in groups))
            pieces = [truncate_tokens(p, budget // 2 - sep_tokens) for p in partials]
            sizes = [count_tokens(p) for p in pieces]

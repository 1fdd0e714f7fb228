"""`hrag schema suggest`: draft a graph schema file from a sample of the documents, for a person to edit.

A seeded sample of chunks (reservoir sampling over the documents in path order, so the same DOCS, chunk
settings and seed give the same sample) goes to the model one chunk per request (llm.LLMClient: cached in
cache/llm.jsonl like extraction, so running it again costs nothing). Each answer names the entity and relation
types the passage shows; the draft keeps every type seen, most frequent first, in the schema file's TOML form
(`[entities.NAME]` description; `[relations.NAME]` description and patterns), with a comment saying in how many
sampled chunks each type and pattern was seen.

Failures are reported as `hrag index` reports them: a cause every request would meet (no server, bad key,
unknown model) stops the run at once with that cause and its fix (exit 1); chunks whose request failed or whose
answer could not be read are counted, the draft is written from the rest and the exit code is 4; nothing
usable at all is exit 1 and nothing is written.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import EXIT_PARTIAL, RunStopped, UsageError
from hrag_cli.extract.parser import clean_type, type_forms
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir

DEFAULT_SAMPLE = 20


@dataclass
class TypeSeen:
    """What the sampled answers said about one type."""

    chunks: int = 0
    descriptions: Counter = field(default_factory=Counter)
    patterns: Counter = field(default_factory=Counter)      # relations: (source, target) -> chunks


@dataclass
class Suggestion:
    entities: dict[str, TypeSeen] = field(default_factory=dict)
    relations: dict[str, TypeSeen] = field(default_factory=dict)
    sampled: int = 0
    answered: int = 0
    failed: int = 0          # the request failed for this chunk alone
    unreadable: int = 0      # an answer with no JSON object of types in it
    llm_requests: int = 0    # sent now (the rest came from the cache)
    errors: list[str] = field(default_factory=list)


def sample_chunks(project: ProjectDir, settings: Settings, reporter: Reporter, roots: list[Path], n: int,
                  seed: int) -> tuple[list[str], int]:
    """Up to `n` chunk texts drawn uniformly from every chunk of `roots` (reservoir sampling, `seed`), and
    how many chunks there were."""
    from hrag_cli.chunk.chunking import chunk_text
    from hrag_cli.chunk.documents import scan

    c = settings.chunk
    rng = random.Random(seed)
    sample: list[str] = []
    seen = 0
    scanned = scan(roots, settings.documents, reporter, skip_dirs=[project.root])
    for loaded in sorted(scanned.documents, key=lambda d: d.doc.path):
        for seg in loaded.segments():
            for piece in chunk_text(seg, c.tokens, c.overlap, c.encoding):
                seen += 1
                if len(sample) < n:
                    sample.append(piece.text)
                else:
                    j = rng.randrange(seen)
                    if j < n:
                        sample[j] = piece.text
    return sample, seen


def read_types(text: str) -> tuple[list[tuple[str, str]], list[tuple[str, str, str, str]]] | None:
    """(entity types as (type, description), relation types as (type, description, source, target)) from
    one answer, or None when it holds no usable object."""
    from hrag_cli.query.keywords import reply_object

    data = reply_object(text)
    if data is None:
        return None
    ents: list[tuple[str, str]] = []
    rels: list[tuple[str, str, str, str]] = []

    def rows(key: str) -> list[dict]:
        value = data.get(key)
        return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []

    def text_of(row: dict, key: str) -> str:
        v = row.get(key)
        return " ".join(v.split()) if isinstance(v, str) else ""

    for row in rows("entity_types"):
        t = text_of(row, "type")
        if t:
            ents.append((clean_type(t), text_of(row, "description")))
    for row in rows("relation_types"):
        t = text_of(row, "type")
        if t:
            src, tgt = text_of(row, "source"), text_of(row, "target")
            rels.append((clean_type(t), text_of(row, "description"), clean_type(src) if src else "",
                         clean_type(tgt) if tgt else ""))
    if not ents and not rels and "entity_types" not in data:
        return None
    return ents, rels


def _add(table: dict[str, TypeSeen], name: str, desc: str, pattern: tuple[str, str] | None,
         counted: set) -> None:
    """Count one mention of a type in one chunk's answer; a type or pattern counts once per chunk, however
    often the answer names it (`counted` holds what this chunk already counted)."""
    seen = table.setdefault(name, TypeSeen())
    if name not in counted:
        counted.add(name)
        seen.chunks += 1
    if desc:
        seen.descriptions[desc] += 1
    if pattern is not None and (name, pattern) not in counted:
        counted.add((name, pattern))
        seen.patterns[pattern] += 1


async def _ask_all(client, texts: list[str], out: Suggestion, reporter: Reporter) -> None:
    from hrag_cli.extract.prompts import build_schema_messages
    from hrag_cli.core.llm_retry import LLMError, failure_cause

    async def one(text: str) -> str | None:
        try:
            resp = await client.achat(build_schema_messages(text), purpose="schema")
        except LLMError as exc:
            cause = failure_cause(exc, client.settings)
            if cause is not None and cause.run_level:
                raise RunStopped(f"schema suggest stopped: {cause.explain(exc)}; {cause.fix}") from None
            out.failed += 1
            out.errors.append(cause.explain(exc) if cause else str(exc))
            return None
        return resp.text

    answers = []
    with reporter.task("schema", len(texts)) as task:
        tasks = [asyncio.ensure_future(one(t)) for t in texts]
        try:
            for answer in await asyncio.gather(*tasks):
                task.advance(1)
                if answer is None:
                    continue
                types = read_types(answer)
                if types is None:
                    out.unreadable += 1
                else:
                    answers.append(types)
        finally:
            for t in tasks:
                t.cancel()
    out.answered = len(answers)
    name = _singular_of({n for ents, rels in answers for n, *_ in (*ents, *rels)}
                        | {end for _, rels in answers for r in rels for end in r[2:] if end})
    for ents, rels in answers:
        counted_e: set = set()
        counted_r: set = set()
        for t, desc in ents:
            _add(out.entities, name(t), desc, None, counted_e)
        for t, desc, src, tgt in rels:
            _add(out.relations, name(t), desc, (name(src), name(tgt)) if src and tgt else None, counted_r)


def _singular_of(names: set[str]):
    """A type name -> the singular (or American) spelling of it that the answers also used ("organizations"
    -> "organization" when both were said; parser.type_forms), else itself."""
    def name(t: str) -> str:
        return next((form for form in type_forms(t) if form in names), t)
    return name


def suggest_schema(project: ProjectDir, settings: Settings, reporter: Reporter, roots: list[Path], *,
                   sample: int = DEFAULT_SAMPLE, seed: int = 0) -> Suggestion:
    """Sample, ask, count. RunStopped when a request fails in a way every request would (exit 1)."""
    from hrag_cli.core.llm import LLMClient

    if not settings.llm.model:
        raise UsageError("schema suggest needs a model: --llm-model, $HRAG_LLM_MODEL or [llm] model in hrag.toml")
    if sample < 1:
        raise UsageError(f"--sample must be at least 1, not {sample}")
    texts, total = sample_chunks(project, settings, reporter, roots, sample, seed)
    out = Suggestion(sampled=len(texts))
    reporter.info(f"schema suggest: {len(texts)} of {total} chunks sampled (seed {seed})")
    with project.lock(), LLMClient(project, settings.llm, reporter=reporter) as client:
        client.run(lambda: _ask_all(client, texts, out, reporter))
        out.llm_requests = client.stats.requests
    if out.answered == 0:
        why = out.errors[0] if out.errors else "no answer held a JSON object of types"
        raise RunStopped(f"schema suggest got no usable answer for {out.sampled} sampled chunk(s) ({why}); "
                         "check --llm-model and --llm-api-base, then run the same command again")
    return out


# ----------------------------------------------------------------------------------------------- the draft

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _string(s: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(s, ensure_ascii=False)


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def _ranked(table: dict[str, TypeSeen]) -> list[tuple[str, TypeSeen]]:
    return sorted(table.items(), key=lambda kv: (-kv[1].chunks, kv[0]))


def _description(seen: TypeSeen, name: str) -> str:
    if not seen.descriptions:
        return f"TODO: say what a {name.replace('_', ' ')} is."
    return min(seen.descriptions.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def render_toml(s: Suggestion, *, source: str, model: str, seed: int) -> str:
    """The draft schema file. Patterns keep only ends that are entity types of the draft (a schema's patterns
    may name nothing else); the comment above each relation lists every pattern seen, kept or not."""
    n = s.sampled
    lines = [
        f"# Draft graph schema from `hrag schema suggest` ({model}, {n} sampled chunks of {source}, seed {seed}).",
        "# Edit it before use: delete the types you do not want, merge near-duplicates, reword descriptions,",
        "# add synonyms = [...] for other names of a type. Then: hrag index DOCS --schema THIS_FILE",
        "# \"seen in k of n\": how many of the sampled chunks the model found that type in.",
        "",
    ]
    entity_names = set(s.entities)
    for name, seen in _ranked(s.entities):
        lines += [f"# seen in {seen.chunks} of {n}", f"[entities.{_key(name)}]",
                  f"description = {_string(_description(seen, name))}", ""]
    for name, seen in _ranked(s.relations):
        ranked = sorted(seen.patterns.items(), key=lambda kv: (-kv[1], kv[0]))
        kept = [p for p, _ in ranked if p[0] in entity_names and p[1] in entity_names]
        note = ", ".join(f"{a} -> {b} ({k})" for (a, b), k in ranked)
        lines.append(f"# seen in {seen.chunks} of {n}" + (f"; patterns seen: {note}" if note else ""))
        lines += [f"[relations.{_key(name)}]", f"description = {_string(_description(seen, name))}"]
        if kept:
            lines.append("patterns = [" + ", ".join(f"[{_string(a)}, {_string(b)}]" for a, b in kept) + "]")
        lines.append("")
    return "\n".join(lines)


def _refuse_existing(path: Path | None) -> None:
    """The draft never replaces a file: it may be the schema a person already edited."""
    if path is not None and path.exists():
        raise UsageError(f"{path} exists: give another --out, or remove it first")


def run_suggest(project: ProjectDir, settings: Settings, reporter: Reporter, roots: list[Path], *,
                sample: int = DEFAULT_SAMPLE, seed: int = 0, out: Path | None = None) -> tuple[str, dict, int]:
    """The command: (draft text, summary, exit code). The draft is written atomically to `out` when given;
    exit 4 when some sampled chunks got no usable answer (the draft is built from the others)."""
    _refuse_existing(out)
    s = suggest_schema(project, settings, reporter, roots, sample=sample, seed=seed)
    draft = render_toml(s, source=", ".join(str(r) for r in roots), model=settings.llm.model, seed=seed)
    if out is not None:
        _refuse_existing(out)
        store.atomic_write_text(out, draft)
    summary = {"sampled": s.sampled, "answered": s.answered, "failed": s.failed, "unreadable": s.unreadable,
               "llm_requests": s.llm_requests, "entity_types": len(s.entities),
               "relation_types": len(s.relations), "out": str(out) if out else ""}
    if s.failed or s.unreadable:
        reporter.warn(f"{s.failed + s.unreadable} of {s.sampled} sampled chunks got no usable answer"
                      + (f" ({s.errors[0]})" if s.errors else "") + "; the draft is built from the others")
        return draft, summary, EXIT_PARTIAL
    return draft, summary, 0

"""The context a retrieval hands to an LLM: entity, relation and source lines, cut by token budgets.

The same line formats are used to count tokens and to print `--context`, so the budgets measure exactly what
is pasted into a prompt. Lists are cut in rank order: the first item that would overflow its budget ends it.
"""

from __future__ import annotations

from hrag_cli.core.config import QuerySettings
from hrag_cli.query.types import RankedChunk, Retrieval


def _tokens(text: str) -> int:
    from hrag_cli.chunk.chunking import count_tokens

    return count_tokens(text)


def entity_line(e: dict) -> str:
    desc = f": {e['description']}" if e.get("description") else ""
    return f"- {e['name']} ({e.get('type') or 'unknown'}){desc}"


def relation_arrow(r: dict) -> str:
    """The `A —[predicates]→ B` of a relation line, the predicates led by the schema relation type if any."""
    pred = "; ".join(r.get("predicates") or []) or "related to"
    if r.get("rel_type"):
        pred = f"{r['rel_type']}: {pred}"
    return f"{r['src']} —[{pred}]→ {r['tgt']}"


def relation_line(r: dict) -> str:
    desc = f": {r['description']}" if r.get("description") else ""
    return f"- {relation_arrow(r)}{desc}"


def fact_line(f: dict) -> str:
    return f"- ({f['subject']}, {f['predicate']}, {f['object']})"


def chunk_block(n: int, c: RankedChunk) -> str:
    return f"[{n}] {c.where}\n{c.text.strip()}\n"


def _cut(items: list, lines: list[str], budget: int, counted: list[int] | tuple = ()) -> tuple[list, int]:
    """The items whose lines fit `budget` in rank order, and their tokens (+1 each); `counted`: the tokens of
    the first lines, already counted."""
    used = 0
    for i, line in enumerate(lines):
        t = (counted[i] if i < len(counted) else _tokens(line)) + 1
        if used + t > budget:
            return items[:i], used
        used += t
    return items, used


def _line_bytes(lines: list[str]) -> list[int]:
    """Each line's UTF-8 bytes and its newline: a bound on its tokens + 1."""
    return [len(x.encode("utf-8")) + 1 for x in lines]


def _fits(lines: list[str], budget: int) -> tuple[int | None, list[int]]:
    """A bound on the lines' tokens (+1 each) when they all fit `budget`, else None; and the tokens of the
    first lines, those it counted. A token is at least one UTF-8 byte, so lines are counted only until the rest
    fits by bytes beside them (a ppr question counts a few lines through tiktoken instead of every line)."""
    sizes = _line_bytes(lines)
    rest = sum(sizes)
    used, counted = 0, []
    for line, size in zip(lines, sizes):
        if used + rest <= budget:
            break
        counted.append(_tokens(line))
        used += counted[-1] + 1
        if used > budget:
            return None, counted
        rest -= size
    return used + rest, counted


def apply_budgets(r: Retrieval, s: QuerySettings, top_k: int) -> None:
    """entities ≤ entity_tokens, relations (and facts) ≤ relation_tokens, then chunks fill what is left of
    context_tokens, at most top_k of them."""
    chunks = r.chunks[:top_k]
    lines_e = [entity_line(e) for e in r.entities]
    lines_r = [relation_line(x) for x in r.relations] + [fact_line(f) for f in r.facts]
    lines_c = [chunk_block(i + 1, c) for i, c in enumerate(chunks)]
    # A token is at least one UTF-8 byte, so when the bytes fit every budget the tokens do too: then nothing is
    # cut and tiktoken (about half a second of a cold `hrag query`) is never loaded. The entity lines often
    # overflow by bytes alone (long descriptions: most ppr questions on a large corpus): `_fits` counts as few
    # of them as it needs, and when everything else fits by bytes beside their bound nothing is cut either.
    e_bound, e_counted = _fits(lines_e, s.entity_tokens)
    nb = [sum(_line_bytes(lines)) for lines in (lines_r, lines_c)]
    if e_bound is not None and nb[0] <= s.relation_tokens and e_bound + sum(nb) <= s.context_tokens:
        r.chunks = chunks
        return
    r.entities, e_used = _cut(r.entities, lines_e, s.entity_tokens, e_counted)   # each line counted once
    nr = len(r.relations)
    r.relations, r_used = _cut(r.relations, lines_r[:nr], s.relation_tokens)
    r.facts, f_used = _cut(r.facts, lines_r[nr:], max(s.relation_tokens - r_used, 0))
    left = max(s.context_tokens - e_used - r_used - f_used, 0)
    kept, _ = _cut(chunks, lines_c, left)
    if len(kept) < len(chunks):
        r.notes.append(f"context budget ({s.context_tokens} tokens) kept {len(kept)} of {len(chunks)} chunks")
    r.chunks = kept


def build_context(r: Retrieval) -> str:
    """The text for `--context` and `--answer`: sources are numbered [n] so an answer can cite them."""
    parts: list[str] = []
    if r.entities:
        parts.append("-----Entities-----\n" + "\n".join(entity_line(e) for e in r.entities))
    if r.relations:
        parts.append("-----Relations-----\n" + "\n".join(relation_line(x) for x in r.relations))
    if r.facts:
        parts.append("-----Facts-----\n" + "\n".join(fact_line(f) for f in r.facts))
    parts.append("-----Sources-----\n" + "\n".join(chunk_block(i + 1, c) for i, c in enumerate(r.chunks)))
    return "\n\n".join(parts)

"""Structural checks on one chunk's extraction, after every answer for it is parsed and merged: what the
parser cannot see because it needs the chunk, the configured types or the prompt.

- An entity whose name occurs in the prompt's worked example and not in the chunk was copied from the
  example: dropped (`prompt_example`).
- An entity type outside the configured list becomes `other` (counted in `retyped`); plural and British
  spellings of a configured type ("persons", "organisation") count as that type. A missing type stays
  `unknown`. With a schema, types are left as the model wrote them: the prune step maps them onto it.
- A relation endpoint that is not one of the chunk's listed entities (by name or alias) is kept only if the name occurs in the
  chunk text as whole words and does not read like a predicate. "was founded by" as a target means the row
  lost its target and every field moved left (`shifted_fields`); a name in neither list nor text is
  `unlisted_endpoint`; an example name is `prompt_example`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache

from hrag_cli.extract.parser import UNKNOWN_TYPE, ParseResult, add_counts, allowed_types, fold, mentions, type_forms

OTHER_TYPE = "other"
PROMPT_EXAMPLE = "prompt_example"
SHIFTED_FIELDS = "shifted_fields"
UNLISTED_ENDPOINT = "unlisted_endpoint"

_AUX = {"is", "was", "were", "are", "be", "been", "being", "has", "had", "have", "did", "does", "do", "will",
        "would", "can", "could", "became", "becomes"}
_PREP = {"by", "of", "in", "to", "for", "with", "at", "from", "on", "into", "as", "about", "under", "over"}


@lru_cache(maxsize=1)
def _example_text() -> str:
    from hrag_cli.extract.prompts import worked_example

    return fold(worked_example()[0])


def _copied(name: str, chunk_folded: str) -> bool:
    return mentions(_example_text(), name) and not mentions(chunk_folded, name)


def _predicate_like(name: str) -> bool:
    """A lowercase verb phrase ("was founded by", "located in") where a name belongs."""
    if any(c.isupper() or c.isdigit() for c in name):
        return False
    words = name.split()
    if not words:
        return False
    return words[0] in _AUX or words[-1] in _PREP or (len(words) == 1 and words[0].endswith("ed"))


def configured_type(t: str, types: frozenset[str]) -> str | None:
    """`t` as one of the configured types, or None."""
    if t in types:
        return t
    return next((cand for cand in type_forms(t) if cand in types), None)


def check_extraction(result: ParseResult, chunk_text: str, entity_types: Iterable[str],
                     retype: bool = True) -> ParseResult:
    """A new ParseResult with the checks above applied, each dropped row counted per reason. `retype` False (a
    schema is given): types stay as the model wrote them, for the prune step to map onto the schema."""
    types = allowed_types(entity_types)
    text = fold(chunk_text)
    dropped: dict[str, int] = {}
    retyped = result.retyped
    entities = []
    for e in result.entities:
        if _copied(e.name, text):
            add_counts(dropped, {PROMPT_EXAMPLE: 1})
            continue
        t = configured_type(e.type, types) if retype else e.type
        if t is None and e.type != UNKNOWN_TYPE:
            t, retyped = OTHER_TYPE, retyped + 1
        entities.append(e if t is None or t == e.type else replace(e, type=t))
    listed = {fold(n) for e in entities for n in (e.name, *e.aliases)}

    def problem(name: str) -> str:
        if fold(name) in listed:
            return ""
        if _copied(name, text):
            return PROMPT_EXAMPLE
        if _predicate_like(name):
            return SHIFTED_FIELDS
        return "" if mentions(text, name) else UNLISTED_ENDPOINT

    relations = []
    for r in result.relations:
        reason = problem(r.src) or problem(r.tgt)
        if reason:
            add_counts(dropped, {reason: 1})
        else:
            relations.append(r)
    return ParseResult(entities=entities, relations=relations, dropped=add_counts(dict(result.dropped), dropped),
                       complete=result.complete, retyped=retyped)

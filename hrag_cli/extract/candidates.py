"""Candidate names for an LLM extraction ([extract] hints = "rules"): shown to the model before the passage,
and kept beside what it answers.

Why keep what the model leaves out: a small model leaves out about as many good candidates (a year, one place
of a list of five) as wrong ones, and judges them no better when asked for a verdict on each; what it does
well is add the names the rules miss and write a name's full extent. So a candidate stays unless the model
listed it or wrote a longer name that contains it ("Lakeland" inside "Lakeland, Florida": it corrected the
extent); a kept candidate carries the rules extractor's type and description, and takes part in the model's
relations like any listed name.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hrag_cli.core.config import ExtractSettings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.records import ExtractedEntity
from hrag_cli.extract.parser import ParseResult, fold, mentions

HINT_SOURCES = ("rules", "none")


def hint_source(extract: ExtractSettings) -> str:
    """[extract] hints: where the candidate names shown to the model come from ("rules"), or "none"."""
    choice = (extract.hints or "none").strip().lower()
    if choice not in HINT_SOURCES:
        raise UsageError(f"[extract] hints takes {', '.join(HINT_SOURCES)}, not '{extract.hints}'")
    return choice


def candidates_of(text: str, source: str) -> list[ExtractedEntity] | None:
    """A chunk's candidates from `source` (hint_source): the offline rules extractor's entities (it finds most
    names of a passage, and some false ones), or None when hints are off."""
    if source == "none":
        return None
    return list(_rule_candidates(text))


@functools.lru_cache(maxsize=256)
def _rule_candidates(text: str) -> tuple[ExtractedEntity, ...]:
    """Once per chunk text: the prompt and the record both need a chunk's candidates (entities are copied
    before they are kept)."""
    from hrag_cli.extract.rules import extract_rules

    return tuple(extract_rules("", text).entities)


def keep_candidates(result: ParseResult, candidates: list[ExtractedEntity] | None) -> ParseResult:
    """`result` with every candidate the model neither listed (by name or alias) nor wrote inside a longer
    name of its own added as an entity. An answer with no usable row stays as it is: a failed extraction,
    not the rules extractor's."""
    if not candidates or not (result.entities or result.relations):
        return result
    listed = {fold(n) for e in result.entities for n in (e.name, *e.aliases)}
    # one text of the model's names, a line each: a whole-word match in it is a match inside one name
    names_text = "\n".join(listed)
    added = []
    for cand in candidates:
        key = fold(cand.name)
        if key in listed or mentions(names_text, key):
            continue
        added.append(replace(cand, aliases=list(cand.aliases)))
        listed.add(key)
    return replace(result, entities=[*result.entities, *added]) if added else result

"""Read an extraction answer given as a JSON object (structured output): {"entities": [...], "relations": [...]}.

The rows go through the same row builders, merging and drop reasons as the delimited format (parser.Rows),
so the checks, gleaning merges and counts cannot tell the formats apart. An answer cut at max_tokens is cut
inside the object: every array item that closed before the cut is kept, the item the cut went through is
counted as truncated. Text around the object (a code fence, a sentence before it) is ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from hrag_cli.extract.parser import ParseResult, Rows, allowed_types, entity_row, relation_row

NOT_JSON = "not_json"          # a JSON-format answer with no JSON object in it
BAD_ITEM = "bad_item"          # an array item that is no object (a bare string, a number)

_DECODER = json.JSONDecoder()
_ARRAY_RE = {key: re.compile(r'"' + key + r'"\s*:\s*\[') for key in ("entities", "relations")}
_WS = " \t\r\n,"


def looks_like_json(text: str) -> bool:
    """An answer whose first non-blank character (after a code fence) opens an object."""
    t = text.lstrip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1].lstrip() if "\n" in t else ""
    return t.startswith("{")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    return "" if value is None else str(value)


def _entity_fields(item: dict) -> list[str]:
    aliases = item.get("aliases")
    fields = [_text(item.get("name")), _text(item.get("type")), _text(item.get("description"))]
    if aliases:
        fields.append("; ".join(_text(a) for a in (aliases if isinstance(aliases, list) else [aliases])))
    return fields


def _relation_fields(item: dict, typed: bool) -> list[str]:
    fields = [_text(item.get("source")), _text(item.get("target"))]
    if typed:
        fields.append(_text(item.get("relation_type")) or "related_to")
    fields += [_text(item.get("predicate")), _text(item.get("keywords")), _text(item.get("description"))]
    strength = item.get("strength")
    if strength is not None:
        fields.append(_text(strength))
    return fields


def _items(text: str, key: str) -> tuple[list[Any], bool]:
    """The items of the object's `key` array read one by one: (items, whether the array was cut before its end)."""
    m = _ARRAY_RE[key].search(text)
    if m is None:
        return [], False
    items: list[Any] = []
    i, n = m.end(), len(text)
    while True:
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:
            return items, True
        if text[i] == "]":
            return items, False
        try:
            item, i = _DECODER.raw_decode(text, i)
        except ValueError:
            return items, True
        items.append(item)


def parse_json_extraction(text: str, entity_types: Iterable[str] | None = None, typed: bool = False,
                          cut: bool = False) -> tuple[ParseResult, int]:
    """(rows, truncated): parse one JSON answer; never raises. `cut`: the answer stopped at max_tokens."""
    types = allowed_types(entity_types)
    rows = Rows(types)
    if not isinstance(text, str) or "{" not in text:
        rows.drop(NOT_JSON)
        return rows.result(False), 0
    start = text.index("{")
    whole: Any = None
    try:
        whole, _ = _DECODER.raw_decode(text, start)
    except ValueError:
        pass
    truncated = 0
    if isinstance(whole, dict):
        groups = {key: whole.get(key) if isinstance(whole.get(key), list) else [] for key in ("entities", "relations")}
        complete = True
    else:   # cut (or broken) inside the object: every item that closed is still good
        groups = {}
        for key in ("entities", "relations"):
            groups[key], open_end = _items(text, key)
            truncated += open_end and cut
        complete = False
        if not any(groups.values()) and not cut:
            rows.drop(NOT_JSON)
            return rows.result(False), 0
    for item in groups["entities"]:
        if isinstance(item, dict):
            rows.add_entity(entity_row(_entity_fields(item), "", types))
        else:
            rows.drop(BAD_ITEM)
    for item in groups["relations"]:
        if isinstance(item, dict):
            rows.add_relation(relation_row(_relation_fields(item, typed), typed))
        else:
            rows.drop(BAD_ITEM)
    return rows.result(complete), min(truncated, 1)

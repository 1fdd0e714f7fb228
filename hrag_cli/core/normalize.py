"""Entity-name normalisation: the one function that decides when two surface forms are the same entity.

The normalised name IS the entity id (docs/design.md, "The project directory"), so it must be stable across runs and
Unicode-safe: NFKC folds full-width and compatibility forms, casefold handles ß/ς and friends, and only
*surrounding* quotes and punctuation are removed, so "東京", "Zürich", "Łódź", "C++" and "Foo (band)" survive intact.
A name made only of punctuation ("(*)", "!!!": real album and band names) is kept whole rather than
stripped to nothing. `strip_quotes` is the one place that decides which edge quotes are wrapping and which
belong to the name (Talkin', 6'11"); the extraction parser and the OpenIE importer use it too.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

_WS_RE = re.compile(r"\s+")
_OPEN_TO_CLOSE = {"(": ")", "[": "]", "{": "}", "（": "）", "【": "】", "「": "」", "『": "』", "《": "》", "〈": "〉"}
_CLOSE_TO_OPEN = {v: k for k, v in _OPEN_TO_CLOSE.items()}


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P")


def _strip_edges(s: str) -> str:
    """Drop quotes/punctuation at both ends, but keep a bracket whose partner is inside the name
    ("foo (band)") and a minus sign in front of a number ("-40 °c")."""
    while s:
        before = s
        first, last = s[0], s[-1]
        # a bracket pair wrapping the whole name: "(foo)" -> "foo"
        if len(s) >= 2 and _OPEN_TO_CLOSE.get(first) == last and s.count(first) == 1 and s.count(last) == 1:
            s = s[1:-1].strip()
            continue
        if _is_punct(first) and not (first in _OPEN_TO_CLOSE and _OPEN_TO_CLOSE[first] in s[1:]) \
                and not (first in "-\u2212" and len(s) > 1 and s[1].isdigit()):
            s = s[1:].lstrip()
        if s and _is_punct(s[-1]) and not (s[-1] in _CLOSE_TO_OPEN and _CLOSE_TO_OPEN[s[-1]] in s[:-1]):
            s = s[:-1].rstrip()
        if s == before:
            break
    return s


@lru_cache(maxsize=1_000_000)
def normalize_name(name: str) -> str:
    """NFKC, case-fold, collapse whitespace, strip surrounding quotes/punctuation. "" means "not a name"
    (only an empty or blank one: a name of punctuation alone stays itself)."""
    s = unicodedata.normalize("NFKC", name).casefold()
    s = _WS_RE.sub(" ", s).strip()
    return _strip_edges(s) or s


QUOTES = "\"'`“”‘’«»„‚‹›「」『』"
_PAIR_QUOTES = {"“": "”", "‘": "’", "«": "»", "„": "“", "‚": "‘", "‹": "›", "「": "」", "『": "』"}
_APOSTROPHES = "'’‘`"          # a lone one at an edge is part of the name: Talkin', 'Allo, '70s
_DOUBLE_AFTER_DIGIT = "\"”″"   # 6'11": inches after a number


def strip_quotes(s: str) -> str:
    """Remove quotes wrapping `s` (a matched pair with no inner quote of that kind), and a lone double
    quote at either end that has no partner; keep apostrophes and an inch mark after a digit."""
    s = s.strip()
    for _ in range(4):
        if not s or (s[0] not in QUOTES and s[-1] not in QUOTES):
            break
        first, last = s[0], s[-1]
        if len(s) >= 2 and first in QUOTES and (first == last or _PAIR_QUOTES.get(first) == last):
            inner = s[1:-1]
            if first not in inner and last not in inner:   # '"A" and "B"' is not one quoted string
                s = inner.strip()
                continue
        if first in QUOTES and first not in _APOSTROPHES and s.count(first) % 2 == 1:
            s = s[1:].strip()
            continue
        if last in QUOTES and last not in _APOSTROPHES and s.count(last) % 2 == 1 \
                and not (last in _DOUBLE_AFTER_DIGIT and len(s) > 1 and s[-2].isdigit()):
            s = s[:-1].strip()
            continue
        break
    return s


def clean_surface(name: str) -> str:
    """A surface form as shown to people: NFKC, single spaces, wrapping quotes removed, case and inner
    punctuation kept ("U.S." stays "U.S.", "Talkin'" keeps its apostrophe)."""
    return strip_quotes(_WS_RE.sub(" ", unicodedata.normalize("NFKC", name)).strip())

"""Entity-name normalisation: the one function that decides when two surface forms are the same entity.

The normalised name IS the entity id (DESIGN.md §2), so it must be stable across runs and Unicode-safe:
NFKC folds full-width and compatibility forms, casefold handles ß/ς and friends, and only *surrounding*
quotes and punctuation are removed, so "東京", "Zürich", "Łódź", "C++" and "Foo (band)" survive intact.
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
    """NFKC, case-fold, collapse whitespace, strip surrounding quotes/punctuation. "" means "not a name"."""
    s = unicodedata.normalize("NFKC", name).casefold()
    s = _WS_RE.sub(" ", s).strip()
    return _strip_edges(s)


_QUOTES = "\"'`“”‘’«»„‚‹›「」『』"


def clean_surface(name: str) -> str:
    """A surface form as shown to people: NFKC, single spaces, surrounding quotes removed, case and inner
    punctuation kept ("U.S." stays "U.S.")."""
    s = _WS_RE.sub(" ", unicodedata.normalize("NFKC", name)).strip()
    return s.strip(_QUOTES + " ")

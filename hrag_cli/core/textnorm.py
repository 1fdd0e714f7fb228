"""Shared tokenisation for the lexical parts of hrag (BM25, the built-in embedder).

One function decides what a "word" is so that BM25 and the built-in embedder agree, and so that
queries and passages always go through the same normalisation.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

__all__ = [
    "STOP_WORDS",
    "TOKEN_RE",
    "normalize_text",
    "raw_tokens",
    "stem",
    "tokenize",
]

# Unicode-aware word tokens: runs of \w (letters, digits, underscore in any script). Apostrophes split,
# so "obama's" -> "obama", "s" and "don't" -> "don", "t"; the orphan "s"/"t" are stop words. Plain \w+
# is faster in CPython's re than any apostrophe-aware pattern, and the embedder's speed budget is
# dominated by this regex.
TOKEN_RE = re.compile(r"\w+")
# Same tokens for pure-ASCII text, faster again: map every ASCII non-word char to a space, split.
_ASCII_SPLIT = str.maketrans(
    {chr(i): " " for i in range(128) if not (chr(i).isalnum() or chr(i) == "_")}
)

# A small hand-written English stop-word list: function words that carry no topical signal.
# Kept short on purpose: words like "first", "new", "city" stay because questions hinge on them.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a about above after again against all also am an and any are aren't as at
    be because been before being below between both but by
    can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they this
    those through to too under until up very was we were what when where which while who whom whose why
    will with would you your yours yourself yourselves s t d ll m re ve
    """.split()
)


def normalize_text(text: str) -> str:
    """NFKC + casefold, so full-width forms, ligatures and case variants compare equal.

    ASCII text takes the fast path (lower() equals NFKC+casefold there).
    """
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKC", text).casefold()


def raw_tokens(text: str) -> list[str]:
    """Word tokens (``\\w+`` runs) of ``text`` after normalisation, no filtering."""
    if text.isascii():
        return text.lower().translate(_ASCII_SPLIT).split()
    return TOKEN_RE.findall(unicodedata.normalize("NFKC", text).casefold())


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """Light, conservative English suffix stripping (plural/-ing/-ed/-ly).

    Deliberately weaker than Porter: it only merges obvious inflections so that proper names
    ("Paris", "Texas") are rarely mangled, and it is cheap enough to run per unique word.
    """
    n = len(word)
    if n <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and n > 4:
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is", "os", "as")):
        word = word[:-1]
        n -= 1
    if word.endswith("ing") and n > 5:
        base = word[:-3]
        if len(base) > 2 and base[-1] == base[-2] and base[-1] not in "lsz":
            base = base[:-1]
        return base
    if word.endswith("ed") and n > 4 and not word.endswith("eed"):
        base = word[:-2]
        if len(base) > 2 and base[-1] == base[-2] and base[-1] not in "lsz":
            base = base[:-1]
        return base
    if word.endswith("ly") and n > 5:
        return word[:-2]
    return word


def tokenize(text: str, *, stop_words: bool = True, stemming: bool = False) -> list[str]:
    """Tokens used for lexical matching.

    ``stop_words=True`` drops the function words in :data:`STOP_WORDS`; ``stemming=True`` applies
    :func:`stem`. Queries and documents must use the same flags.
    """
    toks = raw_tokens(text)
    if stop_words:
        toks = [t for t in toks if t not in STOP_WORDS]
    if stemming:
        toks = [stem(t) for t in toks]
    return toks

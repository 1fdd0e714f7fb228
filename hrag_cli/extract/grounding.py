"""Grounding verification: is an extracted name really in its chunk?

A name is grounded when, after NFKC normalisation and case folding, it (or one of its aliases) occurs in the
chunk as whole words; or, in a script written without spaces, as a substring; or when at least GROUND_OVERLAP
of its content words occur among the chunk's words after light stemming, in any order ("Boards of Harbour"
for "Harbour Board", "Smith, Mary" for "Mary Smith"). A name the model invented fails all three.
"""

from __future__ import annotations

from collections.abc import Iterable

from hrag_cli.core.textnorm import normalize_text, tokenize
from hrag_cli.extract.parser import fold, mentions

GROUND_OVERLAP = 0.75   # 1-3 content words: all must be there; 4 or more: one may be missing


class Grounder:
    """One chunk's text, prepared once for the names of its extraction."""

    def __init__(self, chunk_text: str) -> None:
        self.text = chunk_text
        self.folded = fold(normalize_text(chunk_text))
        self._words: frozenset[str] | None = None

    @property
    def words(self) -> frozenset[str]:
        if self._words is None:   # only names that are not verbatim mentions need the stemmed words
            self._words = frozenset(tokenize(self.text, stop_words=False, stemming=True))
        return self._words

    def grounded(self, names: Iterable[str]) -> bool:
        return any(self._one(n) for n in names if n and n.strip())

    def _one(self, name: str) -> bool:
        folded = fold(normalize_text(name))
        if mentions(self.folded, folded) or (not folded.isascii() and folded in self.folded):
            return True
        words = tokenize(name, stop_words=True, stemming=True) or tokenize(name, stop_words=False, stemming=True)
        if not words:
            return False
        return sum(w in self.words for w in words) / len(words) >= GROUND_OVERLAP

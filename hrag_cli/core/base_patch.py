"""The one base-plus-patch policy: when a patch is folded into a new base.

Four artifacts are kept as a base that an incremental run leaves as it is (hard-linked from the previous
generation) plus a patch of what the run changed: resolve's record files, resolve's merge state (its delta),
the sparse vector indices and the synonym neighbour lists. A run writes its patch alone while the patch is a
small share of the whole; past that share the artifact is written whole as a new base and the patch goes. So a
reader never applies more than that share on top of a base, and a small run never rewrites a base. The shares
differ only where the cost of carrying a patch differs (docs/design.md, "Records and resolve" and
"Embeddings, vector indices, synonyms").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FoldShare:
    """Fold a patch once it holds more than `share` of the items of its whole."""

    share: float

    def folds(self, patched: int, whole: int) -> bool:
        """Whether a patch of `patched` items over `whole` items is written into a new base."""
        return patched > self.share * whole


# record lines made again, of the base's lines: a query reads the patch's plain lines beside the base
RECORD_FILES = FoldShare(0.15)
# chunks in the delta, of the state's chunks: every run merges the delta's records again, so it folds sooner
RESOLVE_STATE = FoldShare(0.1)
# rows inserted or made again, of the base's rows: a search scores the patch rows beside the base, as records
VECTOR_INDEX = FoldShare(0.15)
# lists that differ, of all lists: a run offers new neighbours to many kept entities, so far more lists change
# than entities are added, and a lower share would rewrite the deflated base almost every run
NEIGHBOUR_LISTS = FoldShare(0.3)

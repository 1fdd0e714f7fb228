"""Which module imports a kind of foreign corpus: kept apart from `imported` (the shared records), which the
importers themselves build on, so the imports run one way."""

from __future__ import annotations

from types import ModuleType


def importer(kind: str) -> ModuleType:
    """The importer module, imported only when a run imports (explicit imports, so tools can follow them)."""
    if kind == "lightrag":
        from hrag_cli.extract import lightrag

        return lightrag
    from hrag_cli.extract import graphrag

    return graphrag

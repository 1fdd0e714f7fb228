"""The texts the four vector indices embed, made from the JSONL rows (so millions of them never become
dataclasses)."""

from __future__ import annotations

from hrag_cli.core.config import Settings
from hrag_cli.core.records import fact_text


def entity_text(name: str, description: str) -> str:
    """An entity without a description is its name: the same text the synonym pass embeds, so a cached
    embedder (sentence-transformers, an API) encodes it once (OpenIE imports have no descriptions)."""
    return f"{name}\n{description}" if description else name


def relation_text(r: dict, names: dict[str, str]) -> str:
    kw = ", ".join(r["keywords"])
    return f"{names.get(r['src'], r['src'])}\n{names.get(r['tgt'], r['tgt'])}\n{kw}\n{r['description']}"


def fact_row_text(f: dict) -> str:
    return fact_text(f["subject"], f["predicate"], f["object"])


def relation_vectors(settings: Settings, extractor: str) -> bool:
    """Whether relations get vectors of their own (`vectors.relations`). `auto`: only for an LLM extractor,
    whose relations carry a description and keywords of their own. A rules or OpenIE relation restates its
    facts (the same names and predicate, or the sentence they came from), so its vectors cost a large share of
    the texts embedded and of a rules project's bytes for a ranking global mode gets from the fact vectors."""
    mode = settings.vectors.relations.strip().lower()
    return extractor.startswith("llm:") if mode == "auto" else mode == "on"

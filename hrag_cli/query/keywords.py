"""LightRAG's query keywords: high-level (themes, for the relation index) and low-level (names, for the entity
index). With an LLM configured this is one JSON call, cached in cache/query_llm.jsonl, so asking the same question
twice costs nothing; without one, or when the call fails (one attempt, llm.query_client), the query text
serves as both."""

from __future__ import annotations

import re
from typing import Any

import orjson

from hrag_cli.core.config import Settings
from hrag_cli.core.project import ProjectDir

_OBJECT = re.compile(r"\{.*\}", re.S)


def reply_object(text: str) -> dict | None:
    """The JSON object in a model's reply (code fences and chatter around it tolerated), or None."""
    m = _OBJECT.search(text or "")
    if not m:
        return None
    try:
        data = orjson.loads(m.group(0))
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def parse_keywords(text: str) -> dict[str, list[str]] | None:
    """{"high": [...], "low": [...]} from the model's reply, or None when no usable object is there."""
    data = reply_object(text)
    if data is None:
        return None

    def clean(value: Any) -> list[str]:
        if isinstance(value, str):
            value = [v for v in value.split(",")]
        if not isinstance(value, list):
            return []
        out: list[str] = []
        for v in value:
            if isinstance(v, str) and v.strip() and v.strip() not in out:
                out.append(v.strip())
        return out

    high = clean(data.get("high_level_keywords", data.get("high")))
    low = clean(data.get("low_level_keywords", data.get("low")))
    if not high and not low:
        return None
    return {"high": high, "low": low}


def extract_keywords(project: ProjectDir, settings: Settings, query: str, *, llm: Any = None,
                     notes: list[str] | None = None) -> dict[str, list[str]]:
    """Keywords for the LightRAG modes; any LLM failure degrades to the query text with a note, since a
    retrieval without keywords is still a retrieval."""
    fallback = {"high": [query], "low": [query]}
    if not settings.llm.model:
        return fallback
    from hrag_cli.extract.prompts import build_keywords_messages
    from hrag_cli.core.errors import HragError

    try:
        if llm is None:
            from hrag_cli.core.llm import query_client

            llm = query_client(project, settings.llm)
        resp = llm.chat(build_keywords_messages(query), max_tokens=256, purpose="keywords")
    except HragError as exc:
        if notes is not None:
            from hrag_cli.core.llm import failure_note

            notes.append(f"keywords from the query text, the LLM failed: {failure_note(exc, settings.llm)}")
        return fallback
    parsed = parse_keywords(resp.text)
    if parsed is None:
        if notes is not None:
            notes.append("the LLM's keywords could not be parsed: used the query text")
        return fallback
    return parsed

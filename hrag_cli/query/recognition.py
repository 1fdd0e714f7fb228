"""HippoRAG 2's recognition memory: the LLM keeps only the retrieved facts that bear on the question before
they seed the walk, since a fact close to the query in embedding space can still be about something else.

One chat call per query through the project's LLM client, so it is cached like every other call (asking the
same question again costs nothing). `query.fact_filter`: auto (on when an LLM is configured), on, off.
"""

from __future__ import annotations

from typing import Any

from hrag_cli.core.errors import HragError, UsageError
from hrag_cli.query.keywords import reply_object

FACT_FILTER_VALUES = ("auto", "on", "off")


def check_fact_filter(value: str) -> str:
    """The setting's value, lower-cased; anything but auto, on or off is a usage error in every mode."""
    value = (value or "auto").lower()
    if value not in FACT_FILTER_VALUES:
        raise UsageError(f"setting query.fact_filter: {value!r} must be auto, on or off")
    return value


def filter_enabled(value: str, llm: Any) -> bool:
    """Whether ppr filters its facts: `on` without an LLM is a usage error naming the fix."""
    value = check_fact_filter(value)
    if value == "on" and llm is None:
        raise UsageError("query.fact_filter = on needs an LLM: pass --llm-model or set HRAG_LLM_MODEL "
                         "(or set query.fact_filter = auto)")
    return value != "off" and llm is not None


def parse_kept(text: str, n: int) -> list[int] | None:
    """0-based indices the model kept, in its order, from {"relevant": [1, 3]} (1-based numbers; unknown or
    repeated numbers dropped), or None when the reply holds no such object."""
    data = reply_object(text)
    vals = data.get("relevant", data.get("facts")) if data is not None else None
    if not isinstance(vals, list):
        return None
    out: list[int] = []
    for v in vals:
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) or (isinstance(v, str) and v.strip().isdigit()):
            i = int(v) - 1
            if 0 <= i < n and i not in out:
                out.append(i)
    return out


def recognize(llm: Any, query: str, facts: list[tuple[str, str, str]], notes: list[str]) -> list[int]:
    """Indices of the facts to keep. A failed call or an unreadable reply keeps them all, with a note: the
    filter sharpens retrieval, it must never make a query fail."""
    from hrag_cli.extract.prompts import build_fact_filter_messages

    if not facts:
        return []
    try:
        resp = llm.chat(build_fact_filter_messages(query, facts), max_tokens=256, purpose="fact_filter")
    except HragError as exc:
        from hrag_cli.core.llm import failure_note

        notes.append(f"fact filter kept every fact, the LLM failed: {failure_note(exc, llm.settings)}")
        return list(range(len(facts)))
    kept = parse_kept(resp.text, len(facts))
    if kept is None:
        notes.append("the LLM's fact filter reply could not be parsed: kept every fact")
        return list(range(len(facts)))
    notes.append(f"fact filter kept {len(kept)} of {len(facts)} facts")
    return kept

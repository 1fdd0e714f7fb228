"""The LLM extractor for one chunk: one extraction request, then up to `max_gleanings` continuation rounds
that carry the conversation so far, each answer parsed and merged. Also the network-free re-parse of a
chunk's cached answers (`hrag index --reparse`), which replays exactly the same rounds from cache/llm.jsonl.
"""

from __future__ import annotations

import re
from typing import Any

from ..config import ExtractSettings
from ..errors import BudgetExceeded
from ..records import Chunk, ExtractionRecord
from .checks import check_extraction
from .parser import PARSER_VERSION, ParseResult, merge_gleaning, parse_extraction
from .prompts import build_extraction_messages, build_gleaning_message

# Below this many words a chunk may honestly contain nothing to extract (a heading, a signature).
NONTRIVIAL_WORDS = 8
_WORD_RE = re.compile(r"[^\W\d_]{2,}")


def is_nontrivial(text: str) -> bool:
    return len(_WORD_RE.findall(text, 0, 4000)) >= NONTRIVIAL_WORDS


def build_record(chunk: Chunk, extractor: str, result: ParseResult, rounds: int, keys: list[str],
                 error: str = "") -> ExtractionRecord:
    """An ok record, or a failed one when nothing usable came back for a chunk that has content. A clean
    "nothing here" answer (only the completion marker, no unusable rows) is ok, not failed."""
    empty = not result.entities and not result.relations
    clean_nothing = result.complete and not result.dropped and not error
    failed = bool(error) or (empty and is_nontrivial(chunk.text) and not clean_nothing)
    if failed and not error:
        error = f"no usable rows in the answer ({result.n_dropped} dropped)"
    return ExtractionRecord(chunk_id=chunk.chunk_id, extractor=extractor, entities=result.entities,
                            relations=result.relations, gleaning_rounds=rounds,
                            status="failed" if failed else "ok", dropped_rows=result.n_dropped,
                            llm_keys=list(keys), error=error, dropped=dict(result.dropped),
                            retyped=result.retyped, parser=PARSER_VERSION)


def glean_rounds_for(chunk: Chunk, settings: ExtractSettings) -> int:
    if settings.max_gleanings <= 0 or chunk.n_tokens < settings.glean_min_tokens:
        return 0
    return settings.max_gleanings


def retry_note(attempt: int) -> str:
    """Put before the passage on a --retry-failed attempt: it asks for the format again and, by changing the
    request, gets a fresh answer instead of the cached unreadable one."""
    return (f"(Attempt {attempt}: an earlier answer for this passage could not be read. Answer only with "
            f"records in the exact line format described, then the completion marker.)\n\n")


async def extract_chunk(client: Any, chunk: Chunk, settings: ExtractSettings, extractor: str,
                        attempt: int = 1) -> ExtractionRecord:
    """Extract one chunk through `client` (an LLMClient). A request that fails for good gives a failed
    record (retried only by --retry-failed); BudgetExceeded, and a refusal that would hit every request (bad
    key, unknown model, no quota), propagate, leaving the chunk pending.
    `attempt` > 1 marks a retry of a failed chunk."""
    from ..llm import LLMError, is_run_level

    messages = build_extraction_messages(chunk.text, settings.entity_types, settings.language)
    if attempt > 1:
        messages[-1] = {**messages[-1], "content": retry_note(attempt) + messages[-1]["content"]}
    keys: list[str] = []
    try:
        first = await client.achat(messages, purpose="extract")
    except LLMError as exc:
        if is_run_level(exc):
            raise     # a bad key or model would fail every chunk: stop the run, leave the chunks pending
        return build_record(chunk, extractor, ParseResult(), 0, keys, error=str(exc))
    keys.append(first.key)
    result = parse_extraction(first.text, settings.entity_types)
    rounds = 0
    history = [*messages, {"role": "assistant", "content": first.text}]
    for _ in range(glean_rounds_for(chunk, settings)):
        history.append(build_gleaning_message())
        try:
            more = await client.achat(history, purpose="glean")
        except BudgetExceeded:
            raise
        except LLMError:
            # the first answer stands; losing a gleaning round is not worth failing the chunk
            break
        keys.append(more.key)
        extra = parse_extraction(more.text, settings.entity_types)
        result = merge_gleaning(result, extra, settings.entity_types)
        rounds += 1
        if not extra.entities and not extra.relations:
            break
        history.append({"role": "assistant", "content": more.text})
    return build_record(chunk, extractor, check_extraction(result, chunk.text, settings.entity_types), rounds, keys)


def reparse_chunk(client: Any, chunk: Chunk, old: ExtractionRecord, entity_types: list[str]) -> ExtractionRecord | None:
    """Rebuild a record from its cached answers with the current parser and checks; None when an answer is
    missing from the cache (or the record never had any), since re-parsing must not call the network."""
    if not old.llm_keys:
        return None
    texts: list[str] = []
    for key in old.llm_keys:
        rec = client.cached(key)
        if rec is None or not isinstance(rec.get("response"), str):
            return None
        texts.append(rec["response"])
    result = parse_extraction(texts[0], entity_types)
    for text in texts[1:]:
        result = merge_gleaning(result, parse_extraction(text, entity_types), entity_types)
    return build_record(chunk, old.extractor, check_extraction(result, chunk.text, entity_types), len(texts) - 1,
                        old.llm_keys)

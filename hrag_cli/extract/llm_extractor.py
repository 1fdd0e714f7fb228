"""The LLM extractor for one chunk: one extraction request, then follow-up rounds that carry the conversation
so far (a continuation when an answer was cut at max_tokens, up to `max_gleanings` gleaning rounds after a
finished one), each answer parsed and merged. Also the network-free re-parse of a chunk's cached answers
(`hrag index --reparse`), which replays exactly the same rounds from cache/llm.jsonl.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from hrag_cli.core.config import ExtractSettings, LLMSettings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.records import Chunk, ExtractionRecord
from hrag_cli.extract.candidates import candidates_of, hint_source, keep_candidates
from hrag_cli.extract.checks import check_extraction
from hrag_cli.extract.json_answer import NOT_JSON, looks_like_json, parse_json_extraction
from hrag_cli.extract.parser import (
    PARSER_VERSION, UNREADABLE_GLEANING, ParseResult, add_counts, clean_type, merge_gleaning, parse_extraction,
    says_nothing_more)
from hrag_cli.extract.prompts import (
    DEFAULT_ENTITY_TYPES, build_continuation_message, build_extraction_messages, build_gleaning_message,
    extraction_schema)
from hrag_cli.extract.schema import Schema, schema_of

# Below this many words a chunk may honestly contain nothing to extract (a heading, a signature).
NONTRIVIAL_WORDS = 8
_WORD_RE = re.compile(r"[^\W\d_]{2,}")


def is_nontrivial(text: str) -> bool:
    return len(_WORD_RE.findall(text, 0, 4000)) >= NONTRIVIAL_WORDS


@dataclass
class Answer:
    """One parsed answer and whether the model was stopped before it finished."""

    result: ParseResult
    cut: bool = False        # finish_reason "length": stopped at max_tokens, mid-answer
    truncated: int = 0       # rows dropped because the cut went through them


@dataclass(frozen=True)
class Frame:
    """What an extraction is asked for: the entity types, and the schema when one is given (its types replace
    the configured list, relation rows carry a relation type when it has relation types)."""

    types: list[str]
    schema: Schema | None = None
    fmt: str = "delimited"      # how answers are asked for: "delimited" or "json" (answer_format)
    hints: str = "none"         # where the candidate names shown come from (candidates.hint_source), or "none"

    @property
    def typed(self) -> bool:
        return bool(self.schema is not None and self.schema.relations)

    def answer_schema(self, budget: int) -> dict | None:
        """The JSON schema a "json" answer must follow (None for delimited): the types as enums, and no more
        items than the answer's token budget holds, so a model that starts repeating rows reaches the end of
        its lists, and closes the object, before it reaches max_tokens."""
        if self.fmt != "json":
            return None
        rel_types = tuple(r.name for r in self.schema.relations) if self.typed and self.schema is not None else ()
        items = max(4, (budget - ANSWER_FRAME_TOKENS) // ITEM_TOKENS)
        entities = max(2, (items * 3 + 4) // 5)
        return _answer_schema(tuple(self.types), rel_types, entities, max(2, items - entities))


# What an answer item costs, in tokens: an entity with its short description or a relation with its predicate
# runs about 20-35 in real answers; the frame is the object's own braces and keys.
ITEM_TOKENS = 32
ANSWER_FRAME_TOKENS = 40


@functools.lru_cache(maxsize=256)
def _answer_schema(types: tuple[str, ...], rel_types: tuple[str, ...], entities: int, relations: int) -> dict:
    """Frame.answer_schema, built once per (types, size): the same few schemas serve every chunk."""
    names = list(dict.fromkeys(clean_type(t) for t in types if t.strip())) or list(DEFAULT_ENTITY_TYPES)
    return extraction_schema(names, list(rel_types) or None, entities=entities, relations=relations)


FORMATS = ("auto", "json", "delimited")


def answer_format(extract: ExtractSettings, llm: LLMSettings) -> str:
    """"json" or "delimited": [extract] format, where "auto" asks the provider for a JSON schema when it takes
    one (llm.supports_schema)."""
    choice = (extract.format or "auto").strip().lower()
    if choice not in FORMATS:
        raise UsageError(f"[extract] format takes {', '.join(FORMATS)}, not '{extract.format}'")
    if choice != "auto":
        return choice
    from hrag_cli.core.llm import supports_schema

    return "json" if llm.model and supports_schema(llm) else "delimited"


def frame_of(settings: ExtractSettings, fmt: str = "delimited") -> Frame:
    schema = schema_of(settings)
    return Frame(schema.entity_names if schema is not None else settings.entity_types, schema, fmt,
                 hint_source(settings))


def read_answer(text: str, finish_reason: str = "", frame: Frame | None = None, gleaning: bool = False) -> Answer:
    """Parse one answer. An answer cut at max_tokens ends in a row cut short, which may still parse
    ('Estuary: "River that meets an unusually'): that last line is dropped and counted as truncated.
    A gleaning answer without rows either says that nothing was missed (parser.says_nothing_more, in any
    of its languages: a finished answer) or is counted as `unreadable_gleaning`."""
    types, typed = (frame.types, frame.typed) if frame is not None else (None, False)
    cut = finish_reason == "length"
    if looks_like_json(text):       # either format's cached answers read back, whatever is asked for now
        result, truncated = parse_json_extraction(text, types, typed, cut)
        if gleaning and not cut and not (result.entities or result.relations or result.n_dropped):
            result.complete = True          # empty lists: nothing was missed
        return Answer(result, cut, truncated)
    truncated = 0
    if cut and not text.endswith("\n"):
        text, _, tail = text.rpartition("\n")
        rest = parse_extraction(tail, types, typed)     # prose cut short is not a row; a record cut short is
        truncated = 1 if rest.entities or rest.relations or rest.n_dropped else 0
    result = parse_extraction(text, types, typed)
    if gleaning and not cut and not (result.entities or result.relations or result.n_dropped):
        if says_nothing_more(text):
            result.complete = True
        else:
            result.dropped[UNREADABLE_GLEANING] = 1
    elif (frame is not None and frame.fmt == "json" and not (result.entities or result.relations)
          and not result.complete):
        result.dropped[NOT_JSON] = result.dropped.get(NOT_JSON, 0) + 1   # asked for JSON, got prose
    return Answer(result, cut, truncated)


def build_record(chunk: Chunk, extractor: str, result: ParseResult, rounds: int, keys: list[str],
                 error: str = "", *, error_kind: str = "", truncated: int = 0, cut: bool = False, lost: str = "",
                 attempt: int = 1, continuations: int = 0) -> ExtractionRecord:
    """An ok record; a failed one when nothing usable came back for a chunk that has content; a partial one
    when the rows are usable but a round was lost or the answer stayed cut (`lost` says why, `error_kind`
    which: "gleaning", "continuation" or "truncated"). A clean "nothing here" answer
    (only the completion marker, no unusable rows) is ok, not failed."""
    per_reason = add_counts(dict(result.dropped), {"truncated": truncated} if truncated else {})
    dropped = sum(per_reason.values())
    empty = not result.entities and not result.relations
    clean_nothing = result.complete and dropped == 0 and not error
    failed = bool(error) or (empty and is_nontrivial(chunk.text) and not clean_nothing)
    status = "failed" if failed else ("partial" if lost else "ok")
    if failed and not error:
        if cut:
            error, error_kind = f"no usable rows before the answer was cut at max_tokens ({dropped} dropped)", \
                "truncated"
        else:
            error, error_kind = f"no usable rows in the answer ({dropped} dropped)", "unreadable"
    elif status == "partial":
        error = lost
    return ExtractionRecord(chunk_id=chunk.chunk_id, extractor=extractor, entities=result.entities,
                            relations=result.relations, gleaning_rounds=rounds, status=status,
                            dropped_rows=dropped, llm_keys=list(keys), error=error, dropped=per_reason,
                            retyped=result.retyped, parser=PARSER_VERSION,
                            error_kind="" if status == "ok" else (error_kind or "gleaning"), attempt=attempt,
                            continuations=continuations)


def glean_rounds_for(chunk: Chunk, settings: ExtractSettings) -> int:
    if settings.max_gleanings <= 0 or chunk.n_tokens < settings.glean_min_tokens:
        return 0
    return settings.max_gleanings


def answer_budget(chunk: Chunk, settings: ExtractSettings, max_tokens: int) -> int:
    """max_tokens of one extraction request: room for about twice a typical answer, never more than
    [llm] max_tokens, so a model that loops stops long before it fills its context."""
    return max(1, min(int(max_tokens), settings.answer_tokens_min
                      + int(settings.answer_tokens_per_token * chunk.n_tokens)))


def retry_note(attempt: int) -> str:
    """Put before the passage on a --retry-failed attempt: it asks for the format again and, by changing the
    request, gets a fresh answer instead of the cached unreadable one."""
    return (f"(Attempt {attempt}: an earlier answer for this passage could not be read. Answer only in the "
            f"exact format described.)\n\n")


def _should_glean(answer: Answer) -> bool:
    """Gleaning asks for what a *finished* answer missed. It does not help an answer with no usable rows (the
    model did not follow the format), nor one cut short or without the completion marker (the model was still
    going, or looping: asking for more repeats the problem)."""
    r = answer.result
    return bool(r.entities or r.relations) and r.complete and not answer.cut


def first_request(chunk: Chunk, settings: ExtractSettings, llm: LLMSettings, attempt: int = 1
                  ) -> tuple[Frame, list[dict], int, dict | None]:
    """A chunk's first extraction request: (frame, messages, max_tokens, answer schema). Its cache key tells
    whether the chunk was asked before (a cluster's driver keeps such chunks, whose answers it holds)."""
    frame = frame_of(settings, answer_format(settings, llm))
    found = candidates_of(chunk.text, frame.hints)
    names = None if found is None else [e.name for e in found]
    messages = build_extraction_messages(chunk.text, frame.types, settings.language, frame.schema, frame.fmt, names)
    if attempt > 1:
        messages[-1] = {**messages[-1], "content": retry_note(attempt) + messages[-1]["content"]}
    budget = answer_budget(chunk, settings, llm.max_tokens)
    return frame, messages, budget, frame.answer_schema(budget)


# Continuation rounds per attempt for an answer cut at max_tokens; a chunk still cut after them is "partial",
# and --retry-failed continues the same conversation for this many more (new requests, never a cached one).
CONTINUATIONS = 2


async def extract_chunk(client: Any, chunk: Chunk, settings: ExtractSettings, extractor: str,
                        attempt: int = 1, continuations: int | None = None) -> ExtractionRecord:
    """Extract one chunk through `client` (an LLMClient). A request that fails for good gives a failed
    record (retried only by --retry-failed); BudgetExceeded, and a failure that would hit every request (no
    server, unknown provider, bad key or model, no quota: llm.FailureCause.run_level), propagate, leaving the
    chunk pending (its answers so far are in the response cache, so finishing it later costs only the rest).
    `attempt` > 1 marks a retry of a failed chunk.

    After the first answer come follow-up rounds in one conversation, each with the chunk's own budget: a
    continuation round when the last answer was cut at max_tokens (at most `continuations`, default
    CONTINUATIONS), else a gleaning round when the last answer was finished and gave rows. A lost round, or
    an answer still cut when the continuations run out, makes the record "partial" (its rows are kept;
    --retry-failed completes it)."""
    from hrag_cli.core.llm_retry import LLMError, failure_cause

    frame, messages, budget, schema = first_request(chunk, settings, client.settings, attempt)
    continuations = CONTINUATIONS if continuations is None else continuations
    keys: list[str] = []
    try:
        first = await client.achat(messages, max_tokens=budget, purpose="extract", schema=schema)
    except LLMError as exc:
        cause = failure_cause(exc, client.settings)
        if cause is not None and cause.run_level:
            raise
        return build_record(chunk, extractor, ParseResult(), 0, keys,
                            error=cause.explain(exc) if cause else str(exc),
                            error_kind=cause.kind if cause else "rejected", attempt=attempt)
    keys.append(first.key)
    types = frame.types
    answer = last = read_answer(first.text, first.finish_reason, frame)
    result, truncated = answer.result, answer.truncated
    gleanings, conts, glean_max = 0, 0, glean_rounds_for(chunk, settings)
    lost = lost_kind = ""
    may_glean = _should_glean(answer)
    history = [*messages, {"role": "assistant", "content": first.text}]
    while True:
        if last.cut and conts >= continuations:
            lost, lost_kind = (f"answer still cut at max_tokens after {conts} continuation round(s)",
                               "truncated")
            break
        if last.cut:
            turn, purpose = build_continuation_message(frame.fmt), "continue"
        elif may_glean and gleanings < glean_max:
            turn, purpose = build_gleaning_message(frame.fmt), "glean"
        else:
            break
        history.append(turn)
        what = "continuation" if purpose == "continue" else "gleaning"
        done = conts if purpose == "continue" else gleanings
        try:
            more = await client.achat(history, max_tokens=budget, purpose=purpose, schema=schema)
        except LLMError as exc:
            cause = failure_cause(exc, client.settings)
            if cause is not None and cause.run_level:
                raise
            lost, lost_kind = f"{what} round {done + 1} lost: {cause.explain(exc) if cause else exc}", what
            break
        keys.append(more.key)
        last = read_answer(more.text, more.finish_reason, frame, gleaning=purpose == "glean")
        size = len(result.entities) + len(result.relations)
        result = merge_gleaning(result, last.result, types)
        truncated += last.truncated
        if purpose == "continue":
            conts += 1
            may_glean = bool(result.entities or result.relations) and last.result.complete and not last.cut
        else:
            gleanings += 1
            # another round only after one that found something new: a round that repeats rows is done too
            may_glean = _should_glean(last) and len(result.entities) + len(result.relations) > size
        history.append({"role": "assistant", "content": more.text})
    return build_record(chunk, extractor, checked(result, chunk, frame), gleanings, keys,
                        error_kind=lost_kind, truncated=truncated, cut=answer.cut, lost=lost, attempt=attempt,
                        continuations=conts)


def checked(result: ParseResult, chunk: Chunk, frame: Frame) -> ParseResult:
    """A chunk's merged answers as its record keeps them: the candidates the model did not reject added,
    then the checks."""
    result = keep_candidates(result, candidates_of(chunk.text, frame.hints))
    return check_extraction(result, chunk.text, frame.types, frame.schema is None)


def reparse_chunk(client: Any, chunk: Chunk, old: ExtractionRecord, frame: Frame,
                  extractor: str = "") -> ExtractionRecord | None:
    """Rebuild a record from its cached answers with the current parser, checks and schema (as `extractor`,
    default the old record's); None when an answer is missing from the cache (or the record never had any),
    since re-parsing must not call the network."""
    if not old.llm_keys:
        return None
    answers: list[Answer] = []
    for key in old.llm_keys:
        rec = client.cached(key)
        if rec is None or not isinstance(rec.get("response"), str):
            return None
        gleaning = bool(answers) and not answers[-1].cut      # the round after a finished answer gleaned
        answers.append(read_answer(rec["response"], str(rec.get("finish_reason") or ""), frame, gleaning))
    result, truncated = answers[0].result, answers[0].truncated
    for extra in answers[1:]:
        result = merge_gleaning(result, extra.result, frame.types)
        truncated += extra.truncated
    lost = old.error if old.status == "partial" else ""
    return build_record(chunk, extractor or old.extractor,
                        checked(result, chunk, frame), len(answers) - 1 - old.continuations, old.llm_keys, truncated=truncated,
                        cut=answers[0].cut, lost=lost, error_kind=old.error_kind if lost else "",
                        attempt=old.attempt, continuations=old.continuations)

"""Turn raw LLM extraction output into entity/relation records, repairing what models typically get wrong.

The parser is deliberately forgiving and never raises: a chunk whose output is half-broken should still
contribute the rows that survive. It reads our `<|#|>` format, LightRAG's current format and LightRAG's
legacy tuple format. Rows that start with a record keyword but cannot be used are counted in `dropped`;
prose, headers and blank lines are ignored silently.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from hrag_cli.records import ExtractedEntity, ExtractedRelation

DEFAULT_PREDICATE = "related to"
UNKNOWN_TYPE = "unknown"

_SEP = "\ue000"  # canonical field delimiter after normalisation (private use; not whitespace to str.strip)

# Full-width / look-alike characters models emit in delimiters.
_CHAR_MAP = str.maketrans({"｜": "|", "＜": "<", "＞": ">", "＃": "#", "〈": "<", "〉": ">", "‹": "<", "›": ">"})

_COMPLETE_RE = re.compile(
    r"(?:<[ \t]*\|?|\||\[)[ \t]*complete[ \t]*(?:\|[ \t]*>?|>|\])",
    re.IGNORECASE,
)
# Damaged delimiters: <|#|>, <|>, <||>, <|#>, <#|>, <|##|>, < | # | >, <|#| (no '>'), |#|, |#|>, #|>.
# The (?<!#) / (?<![...]) guards make each regex start only at the beginning of a run, keeping them linear.
_DELIM_RE = re.compile(r"<[ \t]*[|#][ \t|#]*>?|\|[ \t]*#+[ \t]*\|>?|(?<!#)#+[ \t]*\|[ \t]*>")

_KW = r"(?:entities|entity|relationships|relationship|relations|relation|rel|content_keywords|content_keyword)"
# `##` record separators (legacy LightRAG) when followed by another record.
_HASH_SEP_RE = re.compile(r"(?<!#)##+[ \t]*(?=[(\"'\[ \t]*" + _KW + r"\b)", re.IGNORECASE)
# A record keyword (maybe quoted/bracketed) at the end of the text before a delimiter.
_TAIL_KW_RE = re.compile(r"(?<![\w(\[\"'*`])[(\[\"'*`]*" + _KW + r"[\"'*`\])]*[ \t]*$", re.IGNORECASE)
_KW_TRAIL = "\"'*`])\t "
_KW_ENDINGS = ("entity", "entities", "relationship", "relationships", "relation", "relations", "rel",
               "content_keywords", "content_keyword")
_KEYWORD_SPLIT_RE = re.compile(r"[,;，；、]")
_NUM_RE = re.compile(
    r"^\s*(?:strength\s*[:=]?\s*)?([-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:/\s*10(?:\.0*)?)?\s*$", re.IGNORECASE
)
_TYPE_BAD_RE = re.compile(r"[^\w]+")

_QUOTES = "\"'`“”‘’«»„"
_PAIRS = {"(": ")", "[": "]", "{": "}", "<": ">", "“": "”", "‘": "’", "«": "»", "„": "“"}

_ENTITY_KEYS = {"entity", "entities"}
_RELATION_KEYS = {"relation", "relations", "relationship", "relationships", "rel"}
_IGNORED_KEYS = {"content_keywords", "content_keyword"}


@dataclass
class ParseResult:
    entities: list[ExtractedEntity] = field(default_factory=list)
    relations: list[ExtractedRelation] = field(default_factory=list)
    dropped: int = 0          # rows that started with a record keyword but could not be used
    complete: bool = False    # the completion marker was seen


# ----------------------------------------------------------------------------------------------- cleaning


def _strip_quotes(s: str) -> str:
    """Remove surrounding matched quotes, or a lone unbalanced quote at either end."""
    s = s.strip()
    if not s or (s[0] not in _QUOTES and s[-1] not in _QUOTES):
        return s
    for _ in range(4):
        if len(s) >= 2 and s[0] in _QUOTES and (s[0] == s[-1] or _PAIRS.get(s[0]) == s[-1]):
            inner = s[1:-1]
            if s[0] not in inner and s[-1] not in inner:  # '"A" and "B"' is not one quoted string
                s = inner.strip()
                continue
        if s and s[0] in _QUOTES and s.count(s[0]) % 2 == 1:
            s = s[1:].strip()
            continue
        if s and s[-1] in _QUOTES and s.count(s[-1]) % 2 == 1:
            s = s[:-1].strip()
            continue
        break
    return s


def clean_name(s: str) -> str:
    """Normalise an entity name: no surrounding quotes/brackets/markdown emphasis, single spaces."""
    s = " ".join(s.split())
    if s and s[0].isalnum() and s[-1].isalnum():
        return s  # fast path: nothing to strip
    for _ in range(6):
        before = s
        s = _strip_quotes(s)
        if len(s) >= 2 and _PAIRS.get(s[0]) == s[-1]:
            s = s[1:-1].strip()
        s = s.strip("*").strip()
        if len(s) >= 2 and s[0] == "_" and s[-1] == "_":
            s = s.strip("_").strip()
        if s == before:
            break
    return s


def _name_key(s: str) -> str:
    return s.casefold()


def _clean_text(s: str) -> str:
    return _strip_quotes(" ".join(s.split()))


def _clean_type(s: str) -> str:
    t = clean_name(s).lower()
    t = _TYPE_BAD_RE.sub("_", t).strip("_")
    t = re.sub(r"_+", "_", t)
    return t or UNKNOWN_TYPE


def _clean_keywords(s: str) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for part in _KEYWORD_SPLIT_RE.split(s):
        kw = clean_name(part)
        k = kw.casefold()
        if kw and k not in seen:
            seen.add(k)
            out.append(kw)
    return out


def _parse_strength(s: str) -> float | None:
    m = _NUM_RE.match(_strip_quotes(s))
    if not m:
        return None
    try:
        v = float(m.group(1))
    except ValueError:
        return None
    if math.isnan(v) or math.isinf(v):
        return None
    return min(10.0, max(0.0, v))


def _looks_like_keywords(s: str) -> bool:
    """Keyword fields are short comma-separated phrases; descriptions are sentences."""
    parts = [p for p in _KEYWORD_SPLIT_RE.split(s) if p.strip()]
    return bool(parts) and all(len(p.split()) <= 4 for p in parts) and not s.rstrip().endswith(".")


# ----------------------------------------------------------------------------------------------- splitting


def _normalise(text: str) -> tuple[str, bool]:
    text = text.translate(_CHAR_MAP).replace("\r\n", "\n").replace("\r", "\n")
    complete = False
    if "omplete" in text or "OMPLETE" in text:
        text, n = _COMPLETE_RE.subn("\n", text)
        complete = n > 0
    text = text.replace("<|#|>", _SEP)  # the well-formed delimiter, cheaply; the regex below is for damage
    if "<" in text or "|" in text or "#|" in text:
        text = _DELIM_RE.sub(_SEP, text)
    if "##" in text:
        text = _HASH_SEP_RE.sub("\n", text)
    return text, complete


def _tail_keyword(part: str) -> tuple[str, str] | None:
    """If `part` ends with a record keyword (it is followed by a delimiter), return (text before it, keyword)."""
    tail = part[-48:]
    if not tail.rstrip(_KW_TRAIL).lower().endswith(_KW_ENDINGS):
        return None
    m = _TAIL_KW_RE.search(tail)
    if m is None:
        return None
    return part[: len(part) - len(tail) + m.start()], m.group(0)


def _rows_of_line(line: str) -> list[list[str]]:
    """Split one line into rows of fields, separating rows glued together on one line.

    A row starts at a record keyword followed by a delimiter. Text before the first one is prose or a broken
    fragment and is ignored. A keyword later on starts a new row only once the current row has at least three
    delimiters (a complete entity); before that it is probably a field value, e.g. an entity of type "entity".
    """
    parts = line.split(_SEP)
    rows: list[list[str]] = []
    cur: list[str] | None = None
    for part in parts[:-1]:
        hit = _tail_keyword(part)
        if hit is not None and (cur is None or len(cur) >= 3):
            head, kw = hit
            if cur is not None:
                if head.strip():
                    cur.append(head)
                rows.append(cur)
            cur = [kw]
        elif cur is not None:
            cur.append(part)
    if cur is not None:
        cur.append(parts[-1])
        rows.append(cur)
    return [_tidy_row(r) for r in rows]


def _tidy_row(fields: list[str]) -> list[str]:
    """Strip row wrappers: `(...)`, a trailing `##`/`,`, and trailing empty fields."""
    fields = [f.strip() for f in fields]
    last = fields[-1]
    if last.endswith("##"):  # legacy record separator left at the end of a row
        last = last.rstrip("#").rstrip()
    last = last.rstrip(",;").rstrip()
    opener = fields[0].lstrip("\"'*`")[:1]
    if opener in ("(", "[") and last.endswith(")" if opener == "(" else "]"):
        last = last[:-1].rstrip()
    fields[-1] = last
    while len(fields) > 1 and not _strip_quotes(fields[-1]):
        fields.pop()
    return fields


def _record_kind(first: str) -> str:
    k = first.strip().strip(_QUOTES + "()[]*` \t").lower()
    if k in _ENTITY_KEYS:
        return "entity"
    if k in _RELATION_KEYS:
        return "relation"
    if k in _IGNORED_KEYS:
        return "ignore"
    return ""


# ----------------------------------------------------------------------------------------------- rows


def _entity_row(fields: list[str]) -> ExtractedEntity | None:
    name = clean_name(fields[0]) if fields else ""
    if not name:
        return None
    type_raw = fields[1] if len(fields) > 1 else ""
    desc_parts = [_clean_text(f) for f in fields[2:]]
    desc = "; ".join(p for p in desc_parts if p)
    if not desc and len(_clean_text(type_raw).split()) > 3:
        # Type slot holds a sentence: the model skipped the type.
        desc, type_raw = _clean_text(type_raw), ""
    return ExtractedEntity(name=name, type=_clean_type(type_raw), description=desc)


def _relation_row(fields: list[str]) -> ExtractedRelation | None:
    if len(fields) < 2:
        return None
    src, tgt = clean_name(fields[0]), clean_name(fields[1])
    if not src or not tgt or _name_key(src) == _name_key(tgt):
        return None
    rest = fields[2:]
    strength: float | None = None
    if rest:
        strength = _parse_strength(rest[-1])
        if strength is not None:
            rest = rest[:-1]
        elif len(rest) == 4 and len(rest[-1].split()) <= 2:
            rest = rest[:-1]  # our 7-field row with a non-numeric strength ("high"): treat as missing
    predicate, keywords, desc = "", [], ""
    if len(rest) == 1:
        # Either a predicate or a description; short phrases are predicates.
        only = _clean_text(rest[0])
        if len(only.split()) <= 5 and not only.endswith("."):
            predicate = only
        else:
            desc = only
    elif len(rest) == 2:
        # src, tgt, X, Y: LightRAG (keywords, description) or legacy tuple (description, keywords, strength).
        kw_field, desc_field = (rest[1], rest[0]) if strength is not None else (rest[0], rest[1])
        if not _looks_like_keywords(kw_field) and _looks_like_keywords(desc_field):
            kw_field, desc_field = desc_field, kw_field
        keywords = _clean_keywords(kw_field)
        desc = _clean_text(desc_field)
        predicate = keywords[0] if keywords else ""
    elif len(rest) >= 3:
        # Ours: predicate, keywords, description (extra fields belong to the description).
        predicate = _clean_text(rest[0])
        keywords = _clean_keywords(rest[1])
        desc = "; ".join(p for p in (_clean_text(f) for f in rest[2:]) if p)
    predicate = clean_name(predicate) or (keywords[0] if keywords else "") or DEFAULT_PREDICATE
    return ExtractedRelation(
        src=src,
        tgt=tgt,
        predicate=predicate,
        keywords=keywords,
        description=desc,
        strength=1.0 if strength is None else strength,
    )


# ----------------------------------------------------------------------------------------------- public


def parse_extraction(text: str) -> ParseResult:
    """Parse one LLM extraction answer; never raises, whatever the model wrote."""
    try:
        return _parse(text)
    except Exception:  # pragma: no cover - defensive: a parser bug must not kill a whole indexing run
        return ParseResult(entities=[], relations=[], dropped=1, complete=False)


def _parse(text: str) -> ParseResult:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        text = "" if text is None else str(text)
    norm, complete = _normalise(text)
    entities: dict[str, ExtractedEntity] = {}
    relations: dict[tuple[str, str, str], ExtractedRelation] = {}
    dropped = 0
    for raw_line in norm.split("\n"):
        line = raw_line.strip()
        if not line:
            continue
        if _SEP not in line:
            continue  # prose, headers, code fences, bullets-only lines: not records
        if line.endswith("```"):
            line = line.rstrip("`").rstrip()
        for fields in _rows_of_line(line):
            kind = _record_kind(fields[0])
            if kind == "ignore":
                continue
            if _is_template_echo(kind, fields):
                continue
            if kind == "entity":
                ent = _entity_row(fields[1:])
                if ent is None:
                    dropped += 1
                    continue
                key = _name_key(ent.name)
                old = entities.get(key)
                if old is None:
                    entities[key] = ent
                elif len(ent.description) > len(old.description):
                    typ = ent.type if ent.type != UNKNOWN_TYPE else old.type
                    entities[key] = replace(ent, name=old.name, type=typ)
                elif old.type == UNKNOWN_TYPE and ent.type != UNKNOWN_TYPE:
                    old.type = ent.type
            elif kind == "relation":
                rel = _relation_row(fields[1:])
                if rel is None:
                    dropped += 1
                    continue
                rkey = (_name_key(rel.src), _name_key(rel.tgt), rel.predicate.casefold())
                prev = relations.get(rkey)
                if prev is None:
                    relations[rkey] = rel
                else:
                    relations[rkey] = _merge_relation(prev, rel)
            else:
                dropped += 1  # matched a record start but the keyword field is unusable (cannot happen often)
    return ParseResult(
        entities=list(entities.values()),
        relations=list(relations.values()),
        dropped=dropped,
        complete=complete,
    )


_ECHO_NAMES = {"name", "entity_name", "entity name", "source", "src", "source_entity", "source entity"}
_ECHO_SECOND = {"type", "entity_type", "entity type", "target", "tgt", "target_entity", "target entity"}


def _is_template_echo(kind: str, fields: list[str]) -> bool:
    """The model repeated the format line from the prompt (`entity<|#|>NAME<|#|>TYPE...`): a header, not a row."""
    if kind not in ("entity", "relation") or len(fields) < 3:
        return False
    return clean_name(fields[1]).lower() in _ECHO_NAMES and clean_name(fields[2]).lower() in _ECHO_SECOND


def _merge_relation(old: ExtractedRelation, new: ExtractedRelation) -> ExtractedRelation:
    """Keep the first row's endpoints; take the longer description, union keywords, keep the max strength."""
    kws = list(old.keywords)
    seen = {k.casefold() for k in kws}
    for k in new.keywords:
        if k.casefold() not in seen:
            seen.add(k.casefold())
            kws.append(k)
    desc = new.description if len(new.description) > len(old.description) else old.description
    return replace(old, keywords=kws, description=desc, strength=max(old.strength, new.strength))


def merge_gleaning(base: ParseResult, extra: ParseResult) -> ParseResult:
    """Add a gleaning round's new rows to `base` without mutating either input.

    Entities match by case-insensitive name; relations by unordered endpoint pair plus predicate (a gleaning
    round often restates a relation in the other direction). A longer description replaces a shorter one.
    `complete` is true only if both answers ended with the marker; `dropped` is summed.
    """
    entities: dict[str, ExtractedEntity] = {}
    for e in base.entities:
        entities.setdefault(_name_key(e.name), replace(e))
    for e in extra.entities:
        key = _name_key(e.name)
        old = entities.get(key)
        if old is None:
            entities[key] = replace(e)
        else:
            if len(e.description) > len(old.description):
                old.description = e.description
            if old.type == UNKNOWN_TYPE and e.type != UNKNOWN_TYPE:
                old.type = e.type

    def rkey(r: ExtractedRelation) -> tuple[frozenset[str], str]:
        return frozenset((_name_key(r.src), _name_key(r.tgt))), r.predicate.casefold()

    relations: dict[tuple[frozenset[str], str], ExtractedRelation] = {}
    for r in base.relations:
        relations.setdefault(rkey(r), replace(r, keywords=list(r.keywords)))
    for r in extra.relations:
        key = rkey(r)
        old_r = relations.get(key)
        if old_r is None:
            relations[key] = replace(r, keywords=list(r.keywords))
        elif len(r.description) > len(old_r.description):
            old_r.description = r.description
    return ParseResult(
        entities=list(entities.values()),
        relations=list(relations.values()),
        dropped=base.dropped + extra.dropped,
        complete=base.complete and extra.complete,
    )

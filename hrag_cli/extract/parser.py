"""Turn raw LLM extraction output into entity/relation records, repairing what models typically get wrong.

The parser is deliberately forgiving and never raises: a chunk whose output is half-broken should still
contribute the rows that survive. It reads our `<|#|>` format, LightRAG's current format, LightRAG's legacy
tuple format (`("entity"<|>...)##`) and nano-graphrag's tuples, with their known damage: mutated delimiters
(`<|>`, `<[#|>`, `<|*|>`, a bare `|>`), rows glued on one line, `##` separators and debris around fields,
rows whose record keyword is an entity type. Every row the model meant but that cannot be used is counted
in `dropped` under a reason; prose, headers, template echoes and blank lines are not rows.

Every step is a single pass or a regex that cannot backtrack (possessive quantifiers), so the time is
linear in the output's length whatever it contains (bench/parse_speed.py prints the worst case).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from hrag_cli.core.normalize import QUOTES, strip_quotes
from hrag_cli.core.records import ExtractedEntity, ExtractedRelation

# Bump when a change makes the same answer parse differently; `hrag index --reparse` applies it.
PARSER_VERSION = 3

DEFAULT_PREDICATE = "related to"
UNKNOWN_TYPE = "unknown"
MAX_NAME_CHARS = 256        # longer "names" are blobs (base64, whole sentences), not entities

# Reasons a row is dropped (the keys of ParseResult.dropped and of an extraction record's `dropped`).
NO_NAME = "no_name"                      # entity row with an empty name
NAME_ONLY = "name_only"                  # entity row with neither a type nor a description
NAME_TOO_LONG = "name_too_long"          # a name over MAX_NAME_CHARS
MISSING_ENDPOINT = "missing_endpoint"    # relation row without a source or a target
SELF_RELATION = "self_relation"          # relation of an entity to itself
UNKNOWN_RECORD = "unknown_record"        # a delimited row whose first field is no record keyword or type
UNREADABLE_ROW = "unreadable_row"        # a record keyword followed by a delimiter we cannot read
UNREADABLE_GLEANING = "unreadable_gleaning"   # a gleaning answer with no rows that is no "nothing more" either

_SEP = "\ue000"  # canonical field delimiter after normalisation (private use; not whitespace to str.strip)

# Full-width / look-alike characters models emit in delimiters.
_LOOKALIKES = {"｜": "|", "＜": "<", "＞": ">", "＃": "#", "〈": "<", "〉": ">", "‹": "<", "›": ">"}

_COMPLETE_RE = re.compile(
    r"(?:<[ \t]*+\|?+|\||\[)[ \t]*+complete[ \t]*+(?:\|[ \t]*+>?+|>|\])",
    re.IGNORECASE,
)
# Damaged delimiters: <|>, <||>, <|#>, <#|>, <|##|>, < | # | >, <|#| (no '>'), <[#|>, <|*|>, |#|, |#|>, #|>.
# Every quantifier is possessive, so a long run of blanks or bars after a '<' is read once, never re-tried;
# every alternative starts with a literal character (lookbehinds come after it) so the engine scans fast.
_DELIM_RE = re.compile(
    r"<(?=[ \t\[{]*+[|#])[ \t|#\[\]{}]*+(?:\*++[ \t]*+\|[ \t]*+)?+>?+"
    r"|\|[ \t]*+#++[ \t]*+\|>?+"
    r"|#(?<![#<|]#)#*+[ \t]*+\|[ \t]*+>"
)
# A bare `|>` (its `<` lost) on a line that already has delimiters; ` |> ` between blanks is code (a pipe).
_BARE_CLOSE_RE = re.compile(r"\|>(?:(?<![ \t]\|>)|(?![ \t]))")
# `##` between two quoted fields is a field separator: "A"##"B".
_QUOTED_HASH_RE = re.compile(r"([\"'])[ \t]*+##++[ \t]*+(?=[\"'])")

_KW = r"(?:entities|entity|relationships|relationship|relations|relation|rel|content_keywords|content_keyword)"
# `##` record separators (legacy LightRAG) when followed by another record.
_HASH_SEP_RE = re.compile(r"#(?<!##)#++[ \t]*+(?=[(\"'\[ \t]*+" + _KW + r"\b)", re.IGNORECASE)
# A record keyword (maybe quoted/bracketed) at the end of the text before a delimiter.
_TAIL_KW_RE = re.compile(r"(?<![\w(\[\"'*`])([(\[\"'*`]*+)" + _KW + r"([\"'*`\])]*+)[ \t]*+$", re.IGNORECASE)
_KW_TRAIL = "\"'*`])\t "
_KW_ENDINGS = ("entity", "entities", "relationship", "relationships", "relation", "relations", "rel",
               "content_keywords", "content_keyword")
_KEYWORD_SPLIT_RE = re.compile(r"[,;，；、]")
_NUM_RE = re.compile(
    r"\s*+(?:strength\s*+[:=]?+\s*+)?+([-+]?+(?:\d++(?:\.\d*+)?+|\.\d++))\s*+(?:/\s*+10(?:\.0*+)?+)?+\s*+",
    re.IGNORECASE,
)
_TYPE_BAD_RE = re.compile(r"[^\w]+")
_LEAD_MARK_RE = re.compile(r"[-*•>#\s]*+(?:\d{1,3}[.)]\s*+)?+")   # bullets / numbering before a row

_PAIRS = {"(": ")", "[": "]", "{": "}", "<": ">"}
_FIELD_DEBRIS = ")]}|<>#,; \t"      # left after a closing quote: `")`, `"|`, `"<`, `"##)`
_FIELD_LEAD = "([{|<>#, \t"         # left before an opening quote: `("entity"`, `|"SEO"`

_ENTITY_KEYS = {"entity", "entities"}
_RELATION_KEYS = {"relation", "relations", "relationship", "relationships", "rel"}
_IGNORED_KEYS = {"content_keywords", "content_keyword"}

# Template header fields (the format line echoed): compared with letters only, lowercased.
_HEADER_FIRST = {"name", "entityname", "entity", "source", "src", "sourceentity", "sourcename", "sourceentityname",
                 "head", "subject", "entity1"}
_HEADER_SECOND = {"type", "entitytype", "target", "tgt", "targetentity", "targetname", "targetentityname", "tail",
                  "object", "entity2", "relation", "predicate"}
_HEADER_THIRD = {"description", "desc", "entitydescription", "predicate", "relation", "relationship", "keywords",
                 "relationshipkeywords", "type", "entitytype", "relationdescription", "relationshipdescription"}


@dataclass
class ParseResult:
    entities: list[ExtractedEntity] = field(default_factory=list)
    relations: list[ExtractedRelation] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)   # reason -> rows the model meant but we left out
    complete: bool = False    # the completion marker was seen
    retyped: int = 0          # entities whose type was outside the configured list (set by checks.py)

    @property
    def n_dropped(self) -> int:
        return sum(self.dropped.values())


def add_counts(into: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Add per-reason counts into `into` (returned, for chaining)."""
    for k, v in more.items():
        into[k] = into.get(k, 0) + v
    return into


# ----------------------------------------------------------------------------------------------- cleaning


def _has_letter(s: str) -> bool:
    return any(c.isalpha() for c in s)


def clean_name(s: str) -> str:
    """Normalise an entity name: no wrapping quotes/brackets/markdown emphasis, single spaces. Punctuation
    that is part of a name stays: (*), (1), Talkin', 6'11", *NSYNC, C++."""
    s = " ".join(s.split())
    if s and s[0].isalnum() and s[-1].isalnum():
        return s  # fast path: nothing to strip
    for _ in range(6):
        before = s
        s = strip_quotes(s)
        if len(s) >= 2 and _PAIRS.get(s[0]) == s[-1]:
            inner = s[1:-1]
            if _has_letter(inner) and s[0] not in inner and s[-1] not in inner:   # (Paris) yes; (1), (*) no
                s = inner.strip()
        for mark in ("*", "_"):
            if len(s) >= 2 and s[0] == mark and s[-1] == mark:   # **bold**, _italic_; a lone *NSYNC stays
                n = min(len(s) - len(s.lstrip(mark)), len(s) - len(s.rstrip(mark)))
                inner = s[n:-n].strip()
                if any(c.isalnum() for c in inner):
                    s = inner
        if s == before:
            break
    return s


def _name_key(s: str) -> str:
    return s.casefold()


def _unwrap_field(s: str) -> str:
    """Drop debris around a quoted field: `"desc")`, `"desc"|`, `"desc"<`, `"desc"##)`, `("entity"`."""
    t = s.strip()
    if not t:
        return t
    core = t.rstrip(_FIELD_DEBRIS)
    if len(core) != len(t) and core[-1:] in QUOTES:
        t = core
    core = t.lstrip(_FIELD_LEAD)
    if len(core) != len(t) and core[:1] in QUOTES:
        t = core
    return t


def _clean_text(s: str) -> str:
    return strip_quotes(" ".join(s.split()))


def clean_type(s: str) -> str:
    """A type as stored: lowercase, words joined by `_` ("Research Institute" -> research_institute)."""
    t = clean_name(s).lower()
    t = _TYPE_BAD_RE.sub("_", t).strip("_")
    t = re.sub(r"_+", "_", t)
    return t or UNKNOWN_TYPE


def type_forms(key: str) -> tuple[str, ...]:
    """The type names a stored type `key` may stand for besides itself, singular and American spelling first:
    persons -> person, companies -> company, classes -> class, organisations -> organization, people -> person.
    The checks map a model's type onto the configured list with it, the prune step onto a schema."""
    forms: list[str] = []
    for word in dict.fromkeys((key, key.replace("isation", "ization").replace("ise", "ize"))):
        forms.append(word)
        if word.endswith("ies"):
            forms.append(word[:-3] + "y")
        if word.endswith("es"):
            forms.append(word[:-2])
        if word.endswith("s") and not word.endswith("ss"):
            forms.append(word[:-1])
    if key == "people":
        forms.append("person")
    return tuple(f for f in dict.fromkeys(forms) if f and f != key)


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
    m = _NUM_RE.fullmatch(strip_quotes(s))
    if not m:
        return None
    try:
        v = float(m.group(1))
    except ValueError:
        return None
    if math.isnan(v) or math.isinf(v):
        return None
    return min(10.0, max(0.0, v))


def _sentence_like(s: str) -> bool:
    s = s.rstrip()
    return s.endswith((".", "!", "?", "。")) or len(s.split()) >= 8


def _keyword_like(s: str) -> bool:
    """Keyword fields are short comma-separated phrases; descriptions are sentences."""
    parts = [p for p in _KEYWORD_SPLIT_RE.split(s) if p.strip()]
    return bool(parts) and all(len(p.split()) <= 4 for p in parts) and not _sentence_like(s)


# ----------------------------------------------------------------------------------------------- splitting


def _normalise(text: str) -> tuple[str, bool]:
    for odd, plain in _LOOKALIKES.items():   # str.replace per character present: translate() is much slower
        if odd in text:
            text = text.replace(odd, plain)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if _SEP in text:
        text = text.replace(_SEP, " ")   # our internal delimiter must not come from the model
    complete = False
    if "omplete" in text or "OMPLETE" in text:
        text, n = _COMPLETE_RE.subn("\n", text)
        complete = n > 0
    text = text.replace("<|#|>", _SEP)  # the well-formed delimiter, cheaply; the regex below is for damage
    if "<" in text or "|" in text or "#|" in text:
        text = _DELIM_RE.sub(_SEP, text)
    if "##" in text:
        text = _HASH_SEP_RE.sub("\n", text)
        text = _QUOTED_HASH_RE.sub("\\1" + _SEP, text)
    return text, complete


# How a gleaning answer says that nothing was missed, once the completion marker is removed and the text is
# case-folded: English, German, French, Spanish, Portuguese, Italian, Chinese and Japanese, bare or in a
# short sentence ("No additional entities or relations were found.").
_NOTHING_MORE_RE = re.compile(
    r"(?:(?:none|no|nope|n/a|nil|nothing)\b|no (?:more|other|additional|further|new|missing|missed)\b"
    r"|nothing (?:more|else|new|further|additional|was missed|is missing|to add)\b"
    r"|there (?:is|are|was|were) (?:nothing|no)\b|i (?:did not|didn't) miss\b|all (?:entities|relations|records)\b"
    r"|keine?\b|nichts\b|es (?:gibt|wurden?) (?:keine|nichts)\b|alle (?:entitäten|relationen|beziehungen)\b"
    r"|aucun(?:e|s|es)?\b|rien\b|il n'y a (?:rien|pas|aucun)|pas d'autres?\b|tout a été\b"
    r"|nada\b|ningun[oa]?s?\b|ningún\b|no hay\b|no (?:se )?(?:encontr|falt|omit)|todas? (?:las|los)\b"
    r"|nenhum[a]?\b|nessun[oa]?\b|niente\b|non (?:ci sono|c'è)\b"
    r"|没有|无|沒有|無|已(?:全部|经全部)|全部(?:已|都)|なし|ありません)"
    r"[^\n]{0,160}")


def says_nothing_more(text: str) -> bool:
    """A gleaning answer that says nothing was missed: empty after the completion marker is taken out, or one
    short line in one of the "nothing more" forms above. Never true of an answer with a delimited row."""
    if not isinstance(text, str) or len(text) > 400:
        return False
    norm, _ = _normalise(text)
    if _SEP in norm:
        return False
    t = " ".join(norm.split()).strip(" .!。！*`\"'-:").casefold()
    return not t or _NOTHING_MORE_RE.fullmatch(t) is not None


def _tail_keyword(part: str) -> tuple[str, str] | None:
    """If `part` ends with a record keyword (it is followed by a delimiter), return (text before it, keyword).
    A keyword with a closing quote but no opening one ends a quoted field ("... subsidiary entity"), so it
    is not a row start."""
    tail = part[-48:]
    if not tail.rstrip(_KW_TRAIL).lower().endswith(_KW_ENDINGS):
        return None
    m = _TAIL_KW_RE.search(tail)
    if m is None:
        return None
    opening, closing = m.group(1), m.group(2)
    if any(q in closing for q in "\"'`") and not any(q in opening for q in "\"'`"):
        return None
    return part[: len(part) - len(tail) + m.start()], m.group(0)


# Candidates for _tail_keyword; the lookahead lets the engine skip other characters fast (an IGNORECASE
# alternation alone is slow to scan).
_KW_SEP_RE = re.compile(r"(?<!\w)(?=[ercERC])" + _KW + r"[\"'*`\])]*+[ \t]*+" + _SEP, re.IGNORECASE)
_MAX_FIELDS = 16     # a row's fields past this are its description's tail (a looping model's `<|>` runs)
_BOUNDARY_END = (")", "]", "#", ".", "!", "?", "\"", "'", "`", "*", ";", ",")


def _starts_row(first: str, cur_len: int, head: str, kw: str, nxt: str, remaining: int) -> bool:
    """May a keyword found at the end of a field start a new row here, instead of ending the field?

    Only once the current row (first field `first`, `cur_len` fields) is complete enough that the field
    before the keyword can be its last (an entity needs a name and a type, a relation both endpoints and one
    more field), and only when fields follow for the new row: "business relationship<|#|>..." in a
    relation's third field is a value, not a new row. A keyword glued to the text before it with no
    boundary must also be followed by something name-like: "work rel<|#|>Brook works at Lumen Yard." is
    a keyword field ending in an abbreviation.
    """
    need = 4 if _record_kind(first) == "relation" else 3
    if cur_len < need:
        return False
    h = head.rstrip()
    if not h or h.endswith(_BOUNDARY_END):
        return remaining >= 1
    # "first desc entity<|#|>B<|#|>place" glued without a boundary
    return (remaining >= 2 and kw.strip().lower() != "rel" and not _sentence_like(_clean_text(nxt))
            and _parse_strength(nxt) is None)


def _rows_of_line(line: str) -> list[list[str]]:
    """Split one line into rows of fields, separating rows glued together on one line. Fields before the
    first record keyword form a leading row (a type-keyword row, a header, or an unknown record).

    Only parts that end in a record keyword (found by one regex pass) are looked at one by one; the fields
    between them are sliced, so a line of a hundred thousand delimiters costs a split and a few slices.
    """
    parts = line.split(_SEP)
    last = len(parts) - 1
    rows: list[list[str]] = []
    start = -1                # part index of the current row's keyword; -1: the leading row
    first = ""                # the current row's first field
    pos = idx = 0
    for m in _KW_SEP_RE.finditer(line):
        idx += line.count(_SEP, pos, m.start())   # the part the keyword ends
        pos = m.start()
        hit = _tail_keyword(parts[idx])
        if hit is None:
            continue
        head, kw = hit
        if idx > 0:
            if start < 0:
                first = first or _LEAD_MARK_RE.sub("", parts[0], count=1)
                if not _starts_row(first, idx, head, kw, parts[idx + 1], last - idx):
                    continue
                rows.append([first, *parts[1:idx]])
            else:
                if not _starts_row(first, idx - start, head, kw, parts[idx + 1], last - idx):
                    continue
                rows.append([first, *parts[start + 1:idx]])
            if head.strip():
                rows[-1].append(head)
        # idx == 0: text before the line's first keyword is prose ("Output: entity<|#|>...")
        start, first = idx, kw
    if start < 0:
        rows.append([_LEAD_MARK_RE.sub("", parts[0], count=1), *parts[1:]])
    else:
        rows.append([first, *parts[start + 1:]])
    return [_tidy_row(r) for r in rows]


def _tidy_row(fields: list[str]) -> list[str]:
    """Strip row wrappers: `(...)`, trailing `##`/`,`, debris around quoted fields, trailing empty fields."""
    if len(fields) > _MAX_FIELDS:
        tail = " ".join(" ".join(fields[_MAX_FIELDS - 1:]).split())
        fields = [*fields[: _MAX_FIELDS - 1], tail]
    first = fields[0].strip()
    opener = first.lstrip("\"'*`")[:1]
    last = fields[-1].strip()
    for _ in range(3):   # `desc")##`, `desc"##)`, `desc)##,`: peel in any order
        before = last
        last = last.rstrip(",;").rstrip()
        if last.endswith("##"):
            last = last.rstrip("#").rstrip()
        if opener == "(" and last.endswith(")") and last.count(")") > last.count("("):
            last = last[:-1].rstrip()
        elif opener == "[" and last.endswith("]") and last.count("]") > last.count("["):
            last = last[:-1].rstrip()
        if last.endswith("```"):
            last = last.rstrip("`").rstrip()
        if last == before:
            break
    fields = [_unwrap_field(f) for f in (*fields[:-1], last)]
    while len(fields) > 1 and not strip_quotes(fields[-1]):
        fields.pop()
    return fields


def _letters(s: str) -> str:
    """Letters and digits of a short field, lowercased (template field names); "" for a long field."""
    return "" if len(s) > 64 else "".join(c for c in s.lower() if c.isalnum())


def _record_kind(first: str, types: frozenset[str] = frozenset()) -> str:
    k = first.strip().strip(QUOTES + "()[]*`<>{} \t").lower()
    if k in _ENTITY_KEYS:
        return "entity"
    if k in _RELATION_KEYS:
        return "relation"
    if k in _IGNORED_KEYS:
        return "ignore"
    if k and clean_type(k) in types:
        return "typed"      # `event<|#|>Spring Fair<|#|>...`: an entity row with its type as the keyword
    return ""


def _is_header(fields: list[str], kind: str) -> bool:
    """The format line echoed from a prompt (`entity<|#|>EntityName<|#|>EntityType<|#|>Description`, or
    without its keyword): field names where values belong. An entity named Target of type organization
    is data: the field after the two names must be a field name too, when there is one."""
    start = 1 if kind else 0
    if len(fields) < start + 2:
        return False
    return (_letters(fields[start]) in _HEADER_FIRST and _letters(fields[start + 1]) in _HEADER_SECOND
            and (len(fields) == start + 2 or _letters(fields[start + 2]) in _HEADER_THIRD))


# ----------------------------------------------------------------------------------------------- rows


def entity_row(fields: list[str], kw_type: str, types: frozenset[str]) -> ExtractedEntity | str:
    """An entity, or the reason the row is dropped. `kw_type` is the type a type-keyword row named."""
    name = clean_name(fields[0]) if fields else ""
    if not name:
        return NO_NAME
    if len(name) > MAX_NAME_CHARS:
        return NAME_TOO_LONG
    type_raw = fields[1] if len(fields) > 1 else ""
    desc_parts = [_clean_text(f) for f in fields[2:]]
    aliases = alias_list(fields[-1], name) if len(fields) >= 4 else None
    if aliases is not None:
        desc_parts = desc_parts[:-1]
    desc = "; ".join(p for p in desc_parts if p)
    if not desc and len(_clean_text(type_raw).split()) > 3:
        # Type slot holds a sentence: the model skipped the type.
        desc, type_raw = _clean_text(type_raw), ""
    typ = clean_type(type_raw)
    if kw_type and (typ == UNKNOWN_TYPE or typ not in types):
        typ = kw_type           # `event<|#|>Spring Fair<|#|>online event<|#|>...` is an event
    if typ == UNKNOWN_TYPE and not desc:
        return NAME_ONLY        # `Entity<|#|>2023`: nothing was said about it
    return ExtractedEntity(name=name, type=typ, description=desc, aliases=aliases or [])


_NO_ALIASES = {"none", "n/a", "na", "-", "--", "—", "nil", "no aliases", "keine", "aucun", "aucune", "ninguno",
               "ninguna", "无", "没有", "無"}
_ALIAS_PREFIX_RE = re.compile(r"(?:aliases|alias|also known as|aka|other names)[ \t]*+:?+[ \t]*+", re.IGNORECASE)
_MAX_ALIASES = 12


def alias_list(s: str, name: str) -> list[str] | None:
    """The aliases field of an entity row (names separated by ';', or ',' when there is no ';'), or None
    when the field reads like the end of a description rather than a list of names: a sentence, a long
    phrase, or a lowercase multi-word phrase ("born in 1911"). Names equal to `name` are left out."""
    t = _clean_text(s)
    m = _ALIAS_PREFIX_RE.match(t)
    labelled = m is not None
    if m is not None:
        t = t[m.end():]
    if t.casefold().strip(" .") in _NO_ALIASES:
        return []
    if not t:
        return [] if labelled else None
    items = [clean_name(p) for p in t.split(";" if ";" in t else ",")]
    items = [p for p in items if p]
    if not items or len(items) > _MAX_ALIASES:
        return None
    for item in items:
        words = item.split()
        if len(words) > 6 or len(item) > MAX_NAME_CHARS or not any(c.isalnum() for c in item):
            return None
        if len(words) > 1 and not labelled and not any(c.isupper() or (c.isalpha() and not c.isascii())
                                                       for c in item):
            return None
    if t.endswith(("!", "?", "。")) or (t.endswith(".") and " " in items[-1]):
        return None
    return union_aliases(name, [], items)


def fold(s: str) -> str:
    """Case-folded with runs of white space as one blank: the form whole-word mention tests compare."""
    return " ".join(s.casefold().split())


def mentions(text_folded: str, name: str) -> bool:
    """`name` occurs in the folded text as whole words (no word character, as regex \\w, on either side). A
    scan with str.find, not a regex per name: compiling one for each of thousands of names is slow."""
    n = fold(name)
    if not n:
        return False
    start = text_folded.find(n)
    while start != -1:
        end = start + len(n)
        if not (start and _is_word(text_folded[start - 1])) and not (end < len(text_folded)
                                                                     and _is_word(text_folded[end])):
            return True
        start = text_folded.find(n, start + 1)
    return False


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _predicate_from(desc: str, src: str, tgt: str) -> str:
    """'Harry owns Hedwig' -> 'owns': a short sentence naming both ends carries its own predicate."""
    d = desc.rstrip(".").strip()
    low, s, t = d.casefold(), src.casefold(), tgt.casefold()
    if low.startswith(s) and low.endswith(t) and len(d) > len(s) + len(t):
        middle = d[len(s): len(d) - len(t)].strip()
        if middle and len(middle.split()) <= 5:
            return middle
    return ""


def relation_row(fields: list[str], typed: bool = False) -> ExtractedRelation | str:
    """A relation, or the reason the row is dropped. `typed` (a schema prompt): a row with four or more fields
    before the strength starts them with its relation type."""
    if len(fields) < 2:
        return MISSING_ENDPOINT
    src, tgt = clean_name(fields[0]), clean_name(fields[1])
    if not src or not tgt:
        return MISSING_ENDPOINT
    if len(src) > MAX_NAME_CHARS or len(tgt) > MAX_NAME_CHARS:
        return NAME_TOO_LONG
    if _name_key(src) == _name_key(tgt):
        return SELF_RELATION
    rest = fields[2:]
    strength: float | None = None
    if rest:
        strength = _parse_strength(rest[-1])
        if strength is not None:
            rest = rest[:-1]
        elif len(rest) == 4 + typed and len(rest[-1].split()) <= 2:
            rest = rest[:-1]  # our 7-field row with a non-numeric strength ("high"): treat as missing
    rel_type = ""
    if typed and len(rest) >= 4:
        rel_type, rest = clean_type(rest[0]), rest[1:]
    predicate, keywords, desc = "", [], ""
    if len(rest) == 1:
        # A predicate, or (nano-graphrag: src, tgt, description, strength) a description.
        only = _clean_text(rest[0])
        if len(only.split()) <= 5 and not only.endswith(".") \
                and not (strength is not None and (mentions(fold(only), src) or mentions(fold(only), tgt))):
            predicate = only
        else:
            desc = only
            predicate = _predicate_from(only, src, tgt)
    elif len(rest) == 2:
        # src, tgt, X, Y: LightRAG (keywords, description) or legacy tuple (description, keywords, strength).
        kw_field, desc_field = (rest[1], rest[0]) if strength is not None else (rest[0], rest[1])
        kw_field, desc_field = _clean_text(kw_field), _clean_text(desc_field)
        if _sentence_like(kw_field) and _keyword_like(desc_field):
            kw_field, desc_field = desc_field, kw_field   # the two were written the other way round
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
        rel_type=rel_type,
    )


def _type_rank(e: ExtractedEntity, types: frozenset[str]) -> int:
    """How much to trust a row's type: an allowed type, then any short type, then a shifted/missing one."""
    if e.type in types:
        return 2
    if e.type != UNKNOWN_TYPE and e.type.count("_") <= 2:
        return 1
    return 0


def merge_entity(old: ExtractedEntity, new: ExtractedEntity, types: frozenset[str]) -> ExtractedEntity:
    """Two rows of one entity: the row with the more trustworthy type wins, then the longer description;
    the first row's spelling of the name stays, and the aliases of both are kept. (Longest description alone
    would pick a row whose fields were shifted, e.g. a description in the type slot.)"""
    ro, rn = _type_rank(old, types), _type_rank(new, types)
    keep = replace(new, name=old.name) if (rn, len(new.description)) > (ro, len(old.description)) else old
    aliases = union_aliases(old.name, old.aliases, new.aliases)
    return keep if aliases == keep.aliases else replace(keep, aliases=aliases)


def union_aliases(name: str, first: list[str], more: list[str]) -> list[str]:
    """`first` then the names of `more` not seen yet (case-insensitively), none equal to `name`."""
    seen = {_name_key(name)}
    out: list[str] = []
    for a in (*first, *more):
        if _name_key(a) not in seen:
            seen.add(_name_key(a))
            out.append(a)
    return out


# ----------------------------------------------------------------------------------------------- public


def allowed_types(entity_types: Iterable[str] | None) -> frozenset[str]:
    """The configured entity types as stored (clean_type); the prompt's defaults when none are given."""
    if entity_types is None:
        from hrag_cli.extract.prompts import DEFAULT_ENTITY_TYPES

        entity_types = DEFAULT_ENTITY_TYPES
    return frozenset(clean_type(t) for t in entity_types if t and t.strip())


def parse_extraction(text: str, entity_types: Iterable[str] | None = None, typed: bool = False) -> ParseResult:
    """Parse one LLM extraction answer; never raises, whatever the model wrote. `entity_types` (default:
    the prompt's) are the types a row may use as its record keyword, and rank duplicate rows; `typed`: the
    prompt asked for a relation type in each relation row (a schema)."""
    try:
        return _parse(text, allowed_types(entity_types), typed)
    except Exception:  # pragma: no cover - defensive: a parser bug must not kill a whole indexing run
        return ParseResult(dropped={"parser_error": 1})


def _parse(text: str, types: frozenset[str], typed: bool) -> ParseResult:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        text = "" if text is None else str(text)
    norm, complete = _normalise(text)
    rows = Rows(types)
    drop = rows.drop
    for raw_line in norm.split("\n"):
        line = raw_line.strip()
        if not line:
            continue
        if _SEP not in line:
            if not _unreadable(line):
                continue  # prose, headers, code fences, bullets-only lines: not records
            line = _BARE_CLOSE_RE.sub(_SEP, line)     # `entity|>A|>person|>...`: every `<` lost
            if _SEP not in line:
                drop(UNREADABLE_ROW)
                continue
        elif "|>" in line:
            line = _BARE_CLOSE_RE.sub(_SEP, line)
        if line.endswith("```"):
            line = line.rstrip("`").rstrip()
        for fields in _rows_of_line(line):
            kind = _record_kind(fields[0], types)
            if kind == "ignore" or _is_header(fields, kind):
                continue
            if kind in ("entity", "typed"):
                rows.add_entity(entity_row(fields[1:], clean_type(fields[0]) if kind == "typed" else "", types))
            elif kind == "relation":
                rows.add_relation(relation_row(fields[1:], typed))
            elif len(fields) >= 3:
                drop(UNKNOWN_RECORD)   # `node<|#|>A<|#|>person<|#|>...`: a row, but of no kind we know
    return rows.result(complete)


class Rows:
    """The rows of one answer as they are read, whatever its format: entities merged by name, relations by
    (source, target, predicate), every row that cannot be used counted under its reason."""

    def __init__(self, types: frozenset[str]) -> None:
        self.types = types
        self.entities: dict[str, ExtractedEntity] = {}
        self.relations: dict[tuple[str, str, str], ExtractedRelation] = {}
        self.dropped: dict[str, int] = {}

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def add_entity(self, ent: ExtractedEntity | str) -> None:
        """An entity_row result: the entity, or the reason it was dropped."""
        if isinstance(ent, str):
            self.drop(ent)
            return
        key = _name_key(ent.name)
        old = self.entities.get(key)
        self.entities[key] = ent if old is None else merge_entity(old, ent, self.types)

    def add_relation(self, rel: ExtractedRelation | str) -> None:
        """A relation_row result: the relation, or the reason it was dropped."""
        if isinstance(rel, str):
            self.drop(rel)
            return
        rkey = (_name_key(rel.src), _name_key(rel.tgt), rel.predicate.casefold())
        prev = self.relations.get(rkey)
        self.relations[rkey] = rel if prev is None else _merge_relation(prev, rel)

    def result(self, complete: bool) -> ParseResult:
        return ParseResult(entities=list(self.entities.values()), relations=list(self.relations.values()),
                           dropped=self.dropped, complete=complete)


_UNREADABLE_RE = re.compile(r"[(\"'*`\s-]*+" + _KW + r"[\"'*`)]*+[ \t]*+[<|{\[#][^\w\s]", re.IGNORECASE)


def _unreadable(line: str) -> bool:
    """A line that starts like a record (`relation<{#}>A...`) but has no delimiter we can read."""
    return _UNREADABLE_RE.match(line[:64]) is not None


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


def merge_gleaning(base: ParseResult, extra: ParseResult, entity_types: Iterable[str] | None = None) -> ParseResult:
    """Add a gleaning round's new rows to `base` without mutating either input.

    Entities match by case-insensitive name (merged as within one answer: trusted type first, then the
    longer description); relations by unordered endpoint pair plus predicate (a gleaning round often
    restates a relation in the other direction), the longer description kept. `complete` is true only if
    both answers ended with the marker; `dropped` counts are added per reason.
    """
    types = allowed_types(entity_types)
    entities: dict[str, ExtractedEntity] = {}
    for e in base.entities:
        entities.setdefault(_name_key(e.name), replace(e))
    for e in extra.entities:
        key = _name_key(e.name)
        old = entities.get(key)
        entities[key] = replace(e) if old is None else merge_entity(old, replace(e), types)

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
        dropped=add_counts(dict(base.dropped), extra.dropped),
        complete=base.complete and extra.complete,
        retyped=base.retyped + extra.retyped,
    )

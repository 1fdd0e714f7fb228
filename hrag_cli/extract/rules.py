"""The offline extractor: regular expressions and capitalisation, no model, no network, deterministic.

Entities are capitalised multi-word names (with connectors such as "of", "de", "van", "the" kept inside),
acronyms, dates and numbers with units; their type comes from simple cues (name suffixes, titles, the word
before them). Relations join entities that share a sentence, with the words between them as the predicate.
It is the fast mode: good enough to build a navigable graph and to test the pipeline, far below an LLM in
precision (see README: limits of the rules extractor).
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

from hrag_cli.core.records import ExtractedEntity, ExtractedRelation, ExtractionRecord
from hrag_cli.core.textnorm import STOP_WORDS
from hrag_cli.extract.gazetteer import DEMONYMS, GIVEN_NAMES, PLACES
from hrag_cli.extract.lexicon import (
    ARTIFACT_WORDS, AWARD_WORDS, COMMON_STARTERS, COMPOUND_DEMONYMS, DOCUMENT_PARTS, EVENT_WORDS, FUNCTION_WORDS,
    GROUP_POSSESSORS, LOC_PREPOSITIONS, LOC_WORDS, NAME_OPENERS, NAME_TITLES, ON_HEADS, ORG_WORDS, PERSON_TITLES,
    PERSON_VERBS, POSTNOMINALS, PREPOSITIONS, REGNAL, ROLE_NOUNS, SAINTS, STYLES, TOPIC_NOUNS, TRAILING_WORDS,
)

RULES_FINGERPRINT = "rules-v6"

MAX_PREDICATE_WORDS = 6
MAX_DESCRIPTION_CHARS = 300
MAX_NAME_TOKENS = 7
MAX_SENTENCE_FIGURES = 6   # more figures than this, a third of the words: a table row, its quantities skipped
MAX_CHUNK_FIGURES = 5      # a chunk naming this many distinct bare years (quantities) keeps none of them
PAIR_WINDOW = 3          # relate an entity to at most this many following entities of its sentence


def _upper_chars() -> str:
    return "".join(chr(c) for c in range(0x41, 0x2000) if chr(c).isupper())


_UP = "[" + re.escape(_upper_chars()) + "]"
_WORD_TAIL = rf"[\w'’\-]*(?:[+&]{_UP}[\w'’\-]*)*"        # "Springer Science+Business Media"
_TOK_REST = rf"{_WORD_TAIL}(?:\.(?:{_UP}\.)*)?"
_CAP = rf"{_UP}{_TOK_REST}"
_CONNECTORS = ("of", "de", "del", "della", "der", "den", "van", "von", "la", "le", "du", "da", "di", "the",
               "y", "al", "el", "for", "&", "v.", "vs.")
_CONN = "(?:" + "|".join(re.escape(c) for c in sorted(_CONNECTORS, key=len, reverse=True)) + ")"

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
_UNITS = ("km|kilometres|kilometers|kilometre|kilometer|miles|mile|m|metres|meters|metre|meter|cm|mm|ft|feet|"
          "foot|inches|kg|kilograms|g|grams|tonnes|tons|tonne|ton|lb|lbs|pounds|litres|liters|l|ml|"
          "hectares|hectare|ha|acres|acre|%|per cent|percent|degrees|°C|°F|kW|MW|GW|kWh|MWh|V|km²|m²|m³|sq mi|"
          "knots|mph|km/h|FM|MHz|kHz|GHz|years|year|months|month|weeks|week|days|day|hours|hour|minutes|minute")

_NUMBER_WORDS = "million|billion|trillion|thousand|hundred"     # a multiplier, no unit: "5 million" counts nothing
_DATE_AHEAD = rf"(?:{_MONTHS})\.?\s\d"     # a month and its day or year: a date, never the tail of a name
_CURRENCY_REST = rf"\s?\d[\d,]*(?:\.\d+)?(?:\s(?:{_NUMBER_WORDS}))?"
_MONTH_REST = "|".join(m[1:] for m in _MONTHS.split("|"))

# One pass finds every candidate span. Each alternative is (kind, its first character, the rest); the
# pattern consumes the first character from one shared class and dispatches on it with a look-behind, which
# lets the regex engine skip quickly to candidate positions (several times faster than plain `\b...`
# alternatives). Earlier alternatives win: dates, then quantities, years, acronyms, names.
_ALTERNATIVES = [
    ("date", r"\d", rf"(?<![\w.,]\d)\d?\s(?:{_MONTHS})\.?,?\s\d{{3,4}}\b"),               # 8 May 1936
    ("date", "[JFMASOND]", rf"(?<![\w][JFMASOND])(?:{_MONTH_REST})\.?\s(?:\d{{1,2}},?\s)?\d{{4}}\b"),  # March 1987
    ("date", r"\d", r"(?<![\w.,]\d)\d?\s(?:{_MONTHS})\b(?!\.?,?\s\d)".replace("{_MONTHS}", _MONTHS)),  # 16 August
    ("date", "[JFMASOND]",                                                                  # August 6
     rf"(?<![\w][JFMASOND])(?:{_MONTH_REST})\.?\s[0-3]?\d(?:st|nd|rd|th)?\b(?![\d.,:\-–])"),
    ("date", r"\d", r"(?<![\w.,]\d)\d{3}s\b"),                                             # 1930s
    ("date", r"\d", r"(?<![\w.,]\d)\d?(?:st|nd|rd|th)[\s\-]century(?:\s(?:BCE|BC|CE|AD)\b)?"),  # 17th century
    ("date", "[12]",                                                                        # 1910–1942
     rf"(?<![\w.,][12])\d{{3}}\s?[–—\-]\s?(?:[12]\d{{3}}|\d\d)\b(?![\w.,\-–]\d|\s(?:{_MONTHS})\b)"),
    ("date", r"\d", r"(?<![\w.,]\d)\d{0,3}\s?(?:BCE|BC|CE|AD)\b"),                          # 500 BC
    ("quantity", "[$£€¥]", _CURRENCY_REST),                                                  # £4.2 million
    ("quantity", r"\d", rf"(?<![\w.,]\d)[\d,]*(?:\.\d+)?\s?(?:{_UNITS})(?!\w)"),             # 3,200 tonnes
    ("year", "[12]", r"(?<![\w.,][12])(?:(?<=1)\d{3}|(?<=2)0\d\d)\b(?![\w.,]\d)"),          # 1987
    ("name", _UP, rf"(?<![\w'’]{_UP}){_TOK_REST}(?:(?:\s+{_CONN})*\s+(?!{_DATE_AHEAD}){_CAP})*"),  # Bank of Ellery
]
_TOKEN_RE = re.compile(
    r"[\d$£€¥" + _UP[1:-1] + "](?:"
    + "|".join(rf"(?<={first})(?P<g{i}>{rest})" for i, (_, first, rest) in enumerate(_ALTERNATIVES)) + ")"
)
_GROUP_KIND = {f"g{i}": kind for i, (kind, _, _) in enumerate(_ALTERNATIVES)}

_SENTENCE_END_RE = re.compile(r"([.!?][\"'”’)\]]*)\s+|\n+")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "prof", "sr", "jr", "mt", "no", "vs", "etc", "e.g", "i.e",
                  "inc", "ltd", "co", "gen", "col", "capt", "lt", "sgt", "rev", "ft"}
_BULLET_RE = re.compile(r"^\s*(?:[-•+]|\d{1,3}[.)])\s+")
_MARKUP_RE = re.compile(r"[*`#>|]+|(?<!\w)_+|_+(?!\w)")     # underscores inside identifiers stay
_ROLE_TEXT_RE = re.compile(r":\w+:`(~?)!?([^`<\n]*?)(?:\s*<[^`>\n]*>)?`")   # :func:`~a.b` shows "b"
_ROLE_RE = re.compile(r"(?::(\w+):)?`{1,2}([^`\n]{1,80}?)`{1,2}")          # :func:`name`, ``code``, `code`
_CODE_HINT_RE = re.compile(r"\w_\w|\w\(\)|``|:\w+:`|\w::\w|--\w")
# Identifiers in running text: options (--debug, -p), dotted paths (flask.Flask, app.run()), names with an
# underscore (PCRE2_CASELESS, pcre2_compile) and calls (run()).
_IDENT_RE = re.compile(r"(?<![\w.\-/])(?:--?[a-z][\w\-]*|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?"
                       r"|[A-Za-z]\w*_\w+(?:\(\))?|[A-Za-z_]\w*\(\))(?![\w\-(])")
_ROLE_TYPES = {"func": "function", "meth": "function", "function": "function", "class": "class", "exc": "class",
               "attr": "attribute", "data": "attribute", "mod": "module", "module": "module", "option": "option",
               "envvar": "option", "command": "command", "program": "command", "file": "file"}
_FILE_EXTENSIONS = {"py", "html", "rst", "txt", "json", "toml", "cfg", "ini", "c", "h", "js", "css", "md", "yaml",
                    "yml", "sh", "bat", "xml", "csv", "pdf", "so", "dll", "exe", "sql", "in"}
_LITERALS = {"true", "false", "none", "null"}
_WORD_RE = re.compile(r"[\w'’\-]+|[^\w\s]")
_YEAR_RE = re.compile(r"^\d{4}$")
_NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*")
_POSSESSIVE_RE = re.compile(r"['’]s?$")
_SPACE_SPLIT_RE = re.compile(r"\S+")

_MONTH_WORDS = {m.lower() for m in _MONTHS.split("|")}
_WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}

_QUOTES_OPEN = "\"“‘'«"
_QUOTES_CLOSE = "\"”’'»"


_DOTTED_RE = re.compile(r"^(?:\w\.)+\w$")            # "u.s", "j.n": initials, not a sentence end


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    """Sentence spans (start, end) of `text`: cut after . ! ? (closing quotes stay with the sentence) and at
    line breaks, not after abbreviations (Mr., St., ...) or initials (J. R.)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _SENTENCE_END_RE.finditer(text):
        punct = m.group(1)
        if punct is None:                       # line break(s)
            cut = m.start()
        else:
            cut = m.end(1)
            if punct[0] == ".":
                j = m.start()
                k = j
                while k > 0 and (text[k - 1].isalpha() or text[k - 1] == "."):
                    k -= 1
                word = text[k:j].lower()
                if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()) or _DOTTED_RE.match(word):
                    continue
        if cut > start:
            spans.append((start, cut))
        start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


# What follows a name: "(born 1921" / "( died ..." makes it a person; a lone word followed by a lowercase word
# ("an American film", "a German politician") is an adjective of nationality when it has a demonym's ending
# or follows "a"/"an". Without these cues the rules would type many of their names unknown.
_LIFE_RE = re.compile(r"\s*\(\s*(?:born|died|née|nee|b\.|d\.)[\s,]")
_NEXT_WORD_RE = re.compile(r"\s+([a-z][a-z\-]+)\b")
_DEMONYM_ENDINGS = ("an", "ish", "ese", "ic", "ch", "i")   # "an" covers "-ian"
_PLACE_ENDINGS = ("ia", "land", "stan", "burg", "burgh", "bury", "ton", "ville", "ford", "field", "polis", "grad",
                  "shire", "mouth", "port", "wick", "ham", "by", "holm", "abad", "pur", "pura", "berg", "dorf",
                  "heim", "hausen", "stad", "stadt", "sk", "ovo", "evo", "ino", "ow", "ice", "na", "ma", "ka",
                  "sa", "ta", "ara", "ama", "ura", "ola", "ana", "oro", "aro", "ai", "ay", "ey", "au", "ir", "ar")
_GROUP_ENDINGS = ("ans", "ians", "ists", "ites", "ers", "ese", "ars")
_ADJECTIVE_ENDINGS = ("ian", "ean", "ese", "ish", "ic", "al", "ous", "ary", "ive", "born", "language")


# What the sentence says a name is: "X is a 1982 American comedy film directed by ...", "X (1982 film)"
_WORK_KINDS = ("film|song|album|novel|book|single|series|play|opera|musical|episode|poem|painting|magazine|"
               "newspaper|documentary|sitcom|video game|short story|EP")
_WORK_RE = re.compile(rf"\s*\((?:[^()]*\s)?(?:{_WORK_KINDS})\)|\s*(?:\([^()]*\)\s*)?(?:is|was)\s+(?:an?|the)\s+"
                      rf"(?:[\w\-']+\s+){{0,5}}?(?:{_WORK_KINDS})(?=[.,;]|\s+(?:directed|written|produced|by|from|"
                      r"released|starring|about|that|which|in|of|and|based|recorded|performed|composed|published|"
                      r"created|developed|for|set|with))")


def _next_cue(after: str) -> str:
    """'life' when a birth or death date follows a name, 'work' when the sentence says it is a film, a song, a
    book ..., 'adjective' when a lowercase content word follows."""
    if _LIFE_RE.match(after):
        return "life"
    if _WORK_RE.match(after):
        return "work"
    m = _NEXT_WORD_RE.match(after)
    if m and m.group(1) in PERSON_VERBS:
        return "verb"
    return "adjective" if m and m.group(1) not in COMMON_STARTERS else ""      # COMMON_STARTERS holds STOP_WORDS


def code_type(name: str, role: str = "") -> str:
    """The kind of a code name by its role (:func:, :class:, ...) or its shape."""
    if role in _ROLE_TYPES:
        return _ROLE_TYPES[role]
    if name.startswith("-"):
        return "option"
    if name.endswith("()"):
        return "function"
    last = name.rsplit(".", 1)[-1]
    if "." in name and last.lower() in _FILE_EXTENSIONS:
        return "file"
    if name.lower() in _LITERALS or ("_" in name and name.upper() == name):
        return "constant"
    if last[:1].isupper() and not last.isupper():
        return "class"
    return "identifier"


@lru_cache(maxsize=65536)
def _classify_name(name: str, prev_word: str, quoted: bool = False, next_cue: str = "",
                   technical: bool = False) -> str:
    words = name.split()
    if technical and len(words) == 1 and "_" in name:
        return code_type(name)
    low = [w.lower().strip("'’") for w in words]
    last = low[-1]
    of = low.index("of") if "of" in low else len(low)
    if any(w in AWARD_WORDS for w in low[:of]):
        return "award"
    if quoted or next_cue == "work":    # a quoted title in running text, or one the sentence calls a film
        return "work"
    if next_cue == "life":
        return "person"
    if last in ORG_WORDS or any(w in ORG_WORDS for w in low[:of]):
        return "organization"
    if low[0] in NAME_TITLES or (len(low) > 1 and low[1] in REGNAL):
        return "person"
    if last in EVENT_WORDS or low[0] in EVENT_WORDS:
        return "event"
    if last in ARTIFACT_WORDS:
        return "artifact"
    if low[0] in LOC_WORDS or last in LOC_WORDS or (low[0] == "new" and len(low) > 1):
        return "location"
    if prev_word in PERSON_TITLES:
        return "person"
    if len(words) in (2, 3) and not any(w in _CONNECTORS for w in low) and not any(w.isupper() and len(w.rstrip(".")) > 1
                                                                               for w in words):
        return "person"
    if 0 < of <= 2 and words[0][:1].isupper() and len(words) > of + 1:
        return "person"         # "Maria of Nassau", "William Louis of Anhalt": the place words were tested above
    if (next_cue == "adjective" and len(words) == 1 and not _ACRONYM_RE.match(words[0])
            and (prev_word in ("a", "an") or last.endswith(_DEMONYM_ENDINGS))):
        return "nationality"
    if prev_word in LOC_PREPOSITIONS:
        return "location"
    if len(words) == 1 and words[0].isupper() and len(words[0]) > 1:
        return "technology" if technical else "organization"
    if len(words) == 1:
        if last in PLACES:
            return "location"
        if last in DEMONYMS:
            return "nationality"
        if last in GIVEN_NAMES:
            return "person"
        if technical:               # in documentation a bare capitalised word is a product or a standard
            return "technology" if _ACRONYM_RE.match(words[0]) else "product"
        if _ACRONYM_RE.match(words[0]):
            return "organization"
        if last.endswith(_PLACE_ENDINGS):
            return "location"
        if last.endswith(_GROUP_ENDINGS) or (last.endswith("s") and last[:-1] in DEMONYMS):
            return "group"          # "Tatars", "Liberals", "Jesuits": a people, a party, an order
        if last.endswith(_ADJECTIVE_ENDINGS):
            return "nationality" if last.endswith(_DEMONYM_ENDINGS) else "unknown"
        return "person" if prev_word in ("by", "with", "and") or next_cue == "verb" else "location"
    elif low[0] in GIVEN_NAMES:
        return "person"
    elif any(w.isupper() and len(w.rstrip(".")) > 1 for w in words):
        # "POSIX API", "BBC Radio": an acronym inside a name makes it a body or, in documentation, a technology
        return ("technology" if all(w.isupper() for w in words) else "product") if technical else "organization"
    elif technical:
        return "product"
    return "unknown"


class _Span:
    __slots__ = ("start", "end", "name", "type", "initial")

    def __init__(self, start: int, end: int, name: str, type_: str, initial: bool = False) -> None:
        self.start, self.end, self.name, self.type = start, end, name, type_
        self.initial = initial      # a lone capitalised word opening the sentence: kept only if confirmed


def _clean_phrase(phrase: str) -> list[str]:
    words = [w for w in _WORD_RE.findall(phrase) if w[0].isalnum() or w in ("&",)]
    while words and words[0].lower() in ("a", "an", "the", "and", "s"):
        words.pop(0)
    while words and words[-1].lower() in ("a", "an", "the", "and", "its", "his", "her", "their"):
        words.pop()
    return words


_INITIALS_RE = re.compile(rf"^(?:{_UP}\.)+$")         # "J." "U.S."
_INNER_CAP_RE = re.compile(rf"^.[^\s]*{_UP}")
_ABBREV_TOKENS = {"st.", "mt.", "dr.", "jr.", "sr.", "ft.", "mr.", "mrs.", "ms.", "gen.", "col.", "capt.", "lt.",
                  "rev.", "co.", "inc.", "bros.", "no.", "ltd.", "corp.", "sgt.", "prof.", "hon."}
_STRIP_WORDS = COMMON_STARTERS - NAME_OPENERS
_ACRONYM_RE = re.compile(r"^[A-Z0-9&][A-Z0-9&\-]*[A-Z][A-Z0-9&\-]*s?$")


def _groups(toks: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """Cut a run of capitalised tokens into names: after a possessive ("Virginia Tech's Kimballton ...") and
    after a dotted word that is neither an initial nor a title abbreviation ("Paris." at a missed sentence end),
    and before a sentence opener that follows an abbreviation ("the U.S. The war")."""
    out: list[tuple[int, int]] = []
    start = 0
    for k, (_, _, w) in enumerate(toks[:-1]):
        cut = False
        if w.endswith(("'s", "’s")):
            # a descriptive possessive stays inside the name: a plural ("People's Republic", "Children's
            # Hospital"), a saint ("St Paul's Cathedral"), a title standing for the Crown ("King's College")
            cut = not (w[:-2].lower() in GROUP_POSSESSORS or k > 0 and toks[k - 1][2].lower() in SAINTS)
        elif w.endswith("."):
            nxt = toks[k + 1][2].lower().strip("'’")
            cut = not (_INITIALS_RE.match(w) or w.lower() in _ABBREV_TOKENS) or nxt in _STRIP_WORDS
        elif w == "of" and _of_the_name(toks, start, k):
            out.append((start, k))          # "509th Composite Group of the United States Army Air Forces"
            start = k + 2
            continue
        else:
            cut = _two_names(toks, start, k)
        if cut:
            if cut != "office":         # an office before a person's name is a title, dropped as "Mr." is
                out.append((start, k + 1))
            start = k + 1
    out.append((start, len(toks)))
    return [(a, b) for a, b in out if a < b]


def _of_the_name(toks: list[tuple[int, int, str]], start: int, k: int) -> bool:
    """"Minnesota Wild of the National Hockey League": a complete name (a modifier and its head) before "of the"
    and a name of two words or more after it are two names, the second saying where the first belongs. A name
    whose head takes an "of" phrase has that head alone before "of" ("Bank of England", "Order of the British
    Empire"), and an office keeps its "of" phrase ("First Secretary of the Communist Party")."""
    return (k - start >= 2 and toks[k + 1][2] == "the" and len(toks) - (k + 2) >= 2
            and not any(t[2] in _CONNECTORS for t in toks[start:k]) and toks[k - 1][2].lower() not in ROLE_NOUNS)


def _two_names(toks: list[tuple[int, int, str]], start: int, k: int) -> bool | str:
    """Whether a run of capitalised words holds two names that meet between word k and the next: a nationality
    before a person, an acronym or another nationality; honours after a person; "office" where the first is an
    office before a person's name."""
    w, nxt = toks[k][2], toks[k + 1][2]
    low, nlow = w.lower(), nxt.lower()
    last = k + 1 == len(toks) - 1
    if k == start and low in DEMONYMS and (nlow in GIVEN_NAMES or last and (
            (_ACRONYM_RE.match(nxt) and len(nxt) > 2) or (nlow in DEMONYMS and (low, nlow) not in COMPOUND_DEMONYMS))):
        return True     # "American MTV", "Venetian John Cabot", "English Puritan": a nationality, then a name
    if (k > start and low.rstrip(".") in ROLE_NOUNS and len(toks) - k > 2 and nxt not in _CONNECTORS
            and not any(t[2].lower() in ORG_WORDS or t[2].lower() in LOC_WORDS for t in toks[k + 1:])):
        return "office"     # "Prime Minister Margaret Thatcher", "Treasury Secretary Alexander Hamilton"
    if last and nxt.rstrip(".").replace(".", "") in POSTNOMINALS and k - start >= 1:
        return True     # "Mark Achtman FRS": honours after a person's name are not part of it
    return False


_TITLE_LINE_RE = re.compile(rf"^[ \t]*({_UP}[^\n]{{2,100}}?)[ \t]*$", re.MULTILINE)


def _repeated_titles(text: str) -> list[str]:
    """Title lines (a line of two to ten words without a sentence's final punctuation: a document's or a
    section's title) that the text repeats word for word: where the prose writes the title again, that run is
    one name, whatever its capitals and inner words ("Fractional Calculus and Applied Analysis is a journal")."""
    out = []
    for m in _TITLE_LINE_RE.finditer(text):
        title = m.group(1)
        if title[-1] in ".!?:;," or not 2 <= title.count(" ") + 1 <= 10:
            continue
        at = text.find(title, m.end())
        while at >= 0 and (text[at - 1:at].isalnum() or text[at + len(title):at + len(title) + 1].isalnum()):
            at = text.find(title, at + 1)
        if at >= 0 and title not in out:
            out.append(title)
    return out


class _Context:
    """What the whole chunk says about its words: which it writes in lowercase, whether it is technical
    (code names, options, rst roles), and the kinds its roles give to code names."""
    __slots__ = ("lower_words", "technical", "roles", "cap_counts", "titles")

    def __init__(self, text: str) -> None:
        self.lower_words = Counter(re.findall(r"\b[a-z][a-z'’\-]+\b", text))
        self.titles: list[str] = []
        self.roles: dict[str, str] = {}
        self.technical = len(_CODE_HINT_RE.findall(text, 0, 20000)) >= 2
        self.cap_counts: Counter[str] = Counter()
        if self.technical:
            self.cap_counts.update(w.lower() for w in re.findall(r"\b[A-Z][A-Za-z]+\b", text))
            for m in _ROLE_RE.finditer(text):
                body = m.group(2).strip()
                if "<" in body or " " in body.strip("()"):
                    continue        # a link's title, or a phrase
                if body.startswith("~"):
                    body = body.rsplit(".", 1)[-1]
                body = body.lstrip("!.")
                if len(body) > 1 and body.lower() not in _LITERALS:
                    self.roles[body.removesuffix("()")] = code_type(body, m.group(1) or "")
        else:                       # documentation's headings name sections, not things
            self.titles = _repeated_titles(text)

    def common(self, word: str) -> bool:
        """Is this capitalised word an ordinary word of the chunk ("Update" beside "update")?"""
        low = word.lower()
        if self.technical:
            return word not in self.roles and self.lower_words[low] > self.cap_counts[low]
        return low in self.lower_words and low not in PLACES and low not in GIVEN_NAMES


def _code_spans(sentence: str, ctx: _Context) -> list[_Span]:
    out = []
    for m in _IDENT_RE.finditer(sentence):
        tok = m.group(0)
        parts = tok.removesuffix("()").split(".")
        name = tok.removesuffix("()")
        if all(len(p) <= 1 for p in parts) or name.lower() in _LITERALS or name.lower() in FUNCTION_WORDS:
            continue                                    # "e.g", "i.e", a function named "about"
        out.append(_Span(m.start(), m.end(), name, ctx.roles.get(name) or code_type(tok)))
    return out


_QUOTED_RE = re.compile(r"[\"“]([^\"“”\n]{1,160}?)[\"”]")
MAX_QUOTED_WORDS = 8
_LOWER_LONG_WORD_RE = re.compile(r"(?<![\w'’\-])[a-z]{4,}")


def _whole_spans(sentence: str, ctx: _Context) -> list[_Span]:
    """Names taken whole, inner words and capitals as written: the chunk's repeated titles, and titles in
    double quotes (a song, a film, a book: "Will to Love", "The Good, the Bad and the Ugly")."""
    out: list[_Span] = []
    taken: list[tuple[int, int]] = []
    for title in ctx.titles:
        at = sentence.find(title)
        while at >= 0:
            end = at + len(title)
            if not (sentence[at - 1:at].isalnum() or sentence[end:end + 1].isalnum()):
                out.append(_Span(at, end, title, _classify_name(title, "", False, _next_cue(sentence[end:end + 96]))))
                taken.append((at, end))
            at = sentence.find(title, end)
    if not ctx.technical and ("“" in sentence or '"' in sentence):     # quotes in code hold strings
        for m in _QUOTED_RE.finditer(sentence):
            s, e = m.span(1)
            while e > s and sentence[e - 1] in " ,.":
                e -= 1
            while s < e and sentence[s] == " ":
                s += 1
            name = sentence[s:e]
            if (s == e or not (name[0].isupper() or name[0].isdigit()) or " " not in name
                    or name.count(" ") >= MAX_QUOTED_WORDS or any(a < e and s < b for a, b in taken)
                    or len(_LOWER_LONG_WORD_RE.findall(name)) > 1):
                continue        # a quoted phrase or saying, not a title: lowercase words of four letters
            prev = sentence[max(0, s - 24):s].split()
            prev_word = prev[-1].lower().strip(".,;:\"“") if prev else ""
            out.append(_Span(s, e, name, _classify_name(name, prev_word, True)))
    return out


def _name_spans(sentence: str, ctx: _Context) -> list[_Span]:
    spans: list[_Span] = []
    stripped = sentence.lstrip()
    lead = len(sentence) - len(stripped)
    # a run of figures (a climate table, a results row) is data, not a list of things worth naming
    figures = len(_NUMBER_RE.findall(sentence))
    table = figures > MAX_SENTENCE_FIGURES and 3 * figures > sentence.count(" ")
    for m in _TOKEN_RE.finditer(sentence):
        kind = _GROUP_KIND[m.lastgroup or ""]
        s, e = m.start(), m.end()
        text = m.group(0)
        if kind == "date" or kind == "year":
            spans.append(_Span(s, e, text, "date"))
            continue
        if kind == "quantity":
            if not table:
                spans.append(_Span(s, e, text, "quantity"))
            continue
        all_toks = [(w.start(), w.end(), w.group(0)) for w in _SPACE_SPLIT_RE.finditer(text)]
        for gi, gj in _groups(all_toks):
            sp = _one_name(sentence, m.start(), all_toks[gi:gj], lead, ctx)
            if sp is not None:
                spans.append(sp)
    whole = _whole_spans(sentence, ctx)
    if whole:
        # a regex name that holds a whole one entirely is the longer name ("Michigan State University" with the
        # title "Michigan State"); any other regex name overlapping it is a piece of it
        spans = [sp for sp in spans if not any(w.start < sp.end and sp.start < w.end and not (
            sp.start <= w.start and w.end <= sp.end) for w in whole)]
        spans += [w for w in whole if not any(sp.start <= w.start and w.end <= sp.end for sp in spans)]
        spans.sort(key=lambda sp: sp.start)
    if ctx.technical:
        code = _code_spans(sentence, ctx)
        if code:
            spans = [sp for sp in spans if not any(c.start < sp.end and sp.start < c.end for c in code)] + code
            spans.sort(key=lambda sp: sp.start)
    return _merge_year_names(sentence, _join_phrases(sentence, _extend_names(sentence, spans, table)))


# What continues a name past its capitalised words: a company's legal form or a generation after a comma
# ("Publix Super Markets, Inc.", "Peter Williams, Jr.", "Washington, D.C."), a number ("U.S. Route 119", "Apollo 11",
# "Country 97 FM") unless a month follows it (a date: "Bahamas 4 July"), a year that says which edition or which
# law ("Tokyo 2020", "South Africa Act 1909") unless a name follows it ("Mexico City 1968 Summer Olympics").
_NAME_TAIL_RE = re.compile(r",?\s(?:D\.C\.|Inc\.|Ltd\.?|LLC|L\.P\.|PLC|plc|Co\.|Corp\.|Jr\.|Sr\.|S\.A\.|GmbH|AG)(?!\w)"
                           rf"|\s\d{{1,3}}(?:\.\d+)?(?:\s(?:FM|AM))?(?![\w,.:]?\s?\d)(?!\s(?:{_MONTHS})\b)(?![\w%°])"
                           rf"|\s(?:1[5-9]|20)\d\d(?![\w,.:]?\s?\d)(?![\w%°\-–])(?!\s+{_UP})")


_NO_TAIL_TYPES = {"date", "quantity", "constant", "identifier", *_ROLE_TYPES.values()}


def _extend_names(sentence: str, spans: list[_Span], table: bool) -> list[_Span]:
    """Each name with its tail (above); a figure after a name in a table row is a cell of its own."""
    out: list[_Span] = []
    skip_to = -1
    for sp in spans:
        if sp.start < skip_to:
            continue
        if sp.type not in _NO_TAIL_TYPES:           # a code name takes no tail: "--port 80" is an option and 80
            m = _NAME_TAIL_RE.match(sentence, sp.end)
            figure = m is not None and m.group(0)[-1].isdigit()
            if m and not (figure and (table or sp.name.rsplit(None, 1)[-1].lower() in DOCUMENT_PARTS)) and (
                    sp.name.endswith("Washington") or not m.group(0).endswith("D.C.")):
                sp = _Span(sp.start, m.end(), sentence[sp.start:m.end()], sp.type)
                skip_to = m.end()
        out.append(sp)
    return out


def _one_name(sentence: str, base: int, toks: list[tuple[int, int, str]], lead: int,
              ctx: _Context) -> _Span | None:
    """One capitalised run as a name: sentence openers and dangling connectors dropped, possessives and a
    stray final full stop trimmed, typed by `_classify_name`; None when nothing name-like is left."""
    at_start = base + toks[0][0] <= lead
    i, j = 0, len(toks)
    quoted_title = j > 1 and base + toks[0][0] > 0 and sentence[base + toks[0][0] - 1] in _QUOTES_OPEN
    # in running prose (after a lowercase word or a comma) a capitalised opener belongs to a title ("starring in
    # The Karate Kid", "the album Where It All Began"); a preposition, a word in capitals ("LAMPSON, AND
    # LISKOV") or one after other punctuation opens a sentence the cut missed
    before = sentence[:base + toks[0][0]].rstrip()[-1:]
    in_prose = (before == "," or before.islower()) and not toks[0][2].isupper()
    while (not quoted_title and i < j and (at_start or j - i > 1 and (
                not in_prose or i > 0 or toks[i][2].lower() in PREPOSITIONS or toks[i][2] == "I"))
           and not toks[i][2].endswith(".") and toks[i][2].lower().strip("'’") in _STRIP_WORDS):
        i += 1
        while i < j and toks[i][2] in _CONNECTORS:     # connectors left dangling after the dropped word
            i += 1
    if j - i > 2 and toks[i + 1][2] == "of" and toks[i][2].lower() in TOPIC_NOUNS:
        i += 2          # "History of Maryland", "List of Olympic Games": a topic of an article, the name is Maryland
        while i < j and toks[i][2] in _CONNECTORS:
            i += 1
    while j > i and (toks[j - 1][2] in _CONNECTORS or (j - i > 1 and not quoted_title and (
            toks[j - 1][2].lower() in TRAILING_WORDS or toks[j - 1][2].lower().rstrip(".") in _MONTH_WORDS))):
        j -= 1
    if i >= j:
        return None
    title = j - i > 1 and toks[i][2].lower().rstrip(".") in PERSON_TITLES and toks[i + 1][2] not in _CONNECTORS
    if title and toks[i][2].lower() not in STYLES:    # "Mrs Calloway" -> person "Calloway"
        i += 1
    words = [t[2] for t in toks[i:j]]
    last = words[-1]
    if last.endswith(".") and (len(words) > 1 and last in ("I.", "V.", "X.") or not _INITIALS_RE.match(last)) and (
            last.lower() not in ("jr.", "inc.", "co.", "sr.")):     # "World War I." ends its sentence
        last = last[:-1]
    last = _POSSESSIVE_RE.sub("", last) or last
    trim = len(words[-1]) - len(last)
    words[-1] = last
    s, e = base + toks[i][0], base + toks[j - 1][1] - trim
    name = " ".join(words)
    low0 = words[0].lower()
    if len(words) == 1:
        if low0 in _WEEKDAYS:
            return _Span(s, e, name, "date")        # "on Wednesday": a day, as much a date as "16 August"
        if (len(name) < 2 or low0 in _MONTH_WORDS or low0 in FUNCTION_WORDS
                or low0 in _LITERALS or low0.rstrip(".") in NAME_TITLES):
            return None
        if ctx.common(name):
            # the chunk writes it in lowercase too: a common word, capitalised here at the start of a sentence
            # (or anywhere in documentation, whose headings and bullets capitalise verbs: "Update", "Fix")
            return None
        if len(name.rstrip(".")) == 1:
            return None             # a lone initial ("M." of an author list)
        if s <= lead and low0 in COMMON_STARTERS:
            return None
    if len(words) > MAX_NAME_TOKENS:
        return None
    prev = sentence[max(0, s - 24):s].split()
    prev_word = _POSSESSIVE_RE.sub("", prev[-1].lower().strip(".,;:")) if prev else ""
    quoted = s > 0 and sentence[s - 1] in _QUOTES_OPEN and sentence[e:e + 1] in _QUOTES_CLOSE
    type_ = "person" if title else ctx.roles.get(name) or _classify_name(
        name, prev_word, quoted, _next_cue(sentence[e:e + 96]), ctx.technical)
    # a word with a capital past its first letter ("CHSJ-FM", "McCartney") opening a sentence is no common
    # word capitalised there: it needs no second mention, unless it is the whole line (a heading: "SYNOPSIS")
    return _Span(s, e, name, type_, initial=len(words) == 1 and s <= lead and not (
        _INNER_CAP_RE.search(name) and sentence[e:].strip(" .:")))


_COMPLEMENT_RE = re.compile(r" on (?:the )?$")


def _join_phrases(sentence: str, spans: list[_Span]) -> list[_Span]:
    """Neighbouring names that are one name: a head and its complement after "on" ("Treaty on European Union",
    see ON_HEADS), a year after "of" ("War of 1812"), two names joined by "and" (see `_coordinated`)."""
    out: list[_Span] = []
    for sp in spans:
        prev = out[-1] if out else None
        if prev is not None and prev.type not in ("date", "quantity") and sp.type != "quantity":
            gap = sentence[prev.end:sp.start]
            low = prev.name.lower().split()
            if sp.type == "date":
                # "Naturalization Act of 1790", "War of 1812": the year says which act, which war
                join = gap == " of " and prev.type != "person" and sp.name[-4:].isdigit()
            else:
                join = ((low[-1] in ON_HEADS and _COMPLEMENT_RE.match(gap) is not None)
                        or (gap in (" and ", " and the ") and _coordinated(low, gap, sp.name.lower().split())))
            if join:
                out[-1] = _Span(prev.start, sp.end, sentence[prev.start:sp.end], prev.type)
                continue
        out.append(sp)
    return out


def _coordinated(a: list[str], gap: str, b: list[str]) -> bool:
    """Two names joined by "and" that are one: the second completes the first's "of" phrase ("Ministry of
    Environment and Forests": the first an institution, the second a plain noun phrase, no institution, person or
    place of its own), or the first shares the second's head ("Liverpool and Manchester Railway", "Liberal and
    Country Party": the first has no head word of its own)."""
    if f"{a[-1]}{gap}{' '.join(b)}" in PLACES:
        return True         # a country named so: "Trinidad and Tobago", "Saint Vincent and the Grenadines"
    if gap != " and ":
        return False
    heads = ORG_WORDS | ARTIFACT_WORDS
    of = a.index("of") if "of" in a else a.index("for") if "for" in a else -1
    if of > 0:
        return (of < len(a) - 1 and any(w in ORG_WORDS for w in a[:of]) and len(b) <= 3 and b[-1] not in heads
                and b[0] not in GIVEN_NAMES and " ".join(b) not in PLACES)
    return b[-1] in heads and a[-1] not in heads and a[-1] not in LOC_WORDS


_ORDINAL_BEFORE_RE = re.compile(r"(?<![\w.,])\d{1,3}(?:st|nd|rd|th)\s$")


def _merge_year_names(sentence: str, spans: list[_Span]) -> list[_Span]:
    """"the 1964 Summer Olympics", "2011 Census": a year written right before an event's name is part of it;
    so is an ordinal ("14th Lok Sabha", "35th Chess Olympiad", "1st Battalion"): it says which one."""
    out: list[_Span] = []
    for sp in spans:
        m = _ORDINAL_BEFORE_RE.search(sentence, max(0, sp.start - 6), sp.start)
        if m and sp.type not in ("date", "quantity"):
            sp = _Span(m.start(), sp.end, sentence[m.start():sp.end], sp.type)
        prev = out[-1] if out else None
        if (prev is not None and prev.type == "date" and len(prev.name) == 4 and prev.name.isdigit()
                and sentence[prev.end:sp.start] == " " and sp.type not in ("date", "quantity")
                and sp.name.split(None, 1)[0].lower() not in GIVEN_NAMES
                and (sp.type == "event" or sentence[max(0, prev.start - 4):prev.start].lower() == "the ")):
            type_ = "event" if sp.type in ("unknown", "person", "location") else sp.type   # "2010 Census"
            out[-1] = _Span(prev.start, sp.end, f"{prev.name} {sp.name}", type_)
            continue
        out.append(sp)
    return out


def _is_heading(sentence: str) -> bool:
    """Title-case lines (headlines, headings) repeat what the body says and glue names together."""
    if sentence.rstrip()[-1:] in ".!?\"”":
        return False
    words = [w for w in sentence.split() if w[0].isalpha()]
    if len(words) < 4:
        return False
    caps = sum(1 for w in words if w[0].isupper())
    return caps >= 3 and all(w[0].isupper() or w.lower() in STOP_WORDS for w in words)


def _role_text(m: re.Match[str]) -> str:
    """What Sphinx shows for a role: the last component after "~", the title of a link."""
    body = m.group(2).strip()
    return "`" + (body.rsplit(".", 1)[-1] if m.group(1) else body) + "`"


_LATEX_QUOTES_RE = re.compile(r"``\s?([^`\n]{1,200}?)\s?''")     # ``Title'' (quotes typed as in TeX)
_FIGURE_RE = re.compile(rf"^[\W\d_]*(?:(?:{_MONTHS}|{_UNITS}|{_NUMBER_WORDS}|bce?|ce|ad|st|nd|rd|th|century|s)\b"
                        r"[\W\d_]*)*$", re.IGNORECASE)


def is_name(text: str) -> bool:
    """Whether a (normalised) entity name names a thing: not a date, quantity or bare number, not a function
    word. Synonym edges join only names."""
    low = text.strip().lower()
    return bool(low) and low not in FUNCTION_WORDS and not _FIGURE_RE.match(low)


_TITLE_NOTE_RE = re.compile(r"\s*(?:\([^()]*\)|,[^,]*)$")


# No-break and thin spaces ("5\u00a0km") are spaces: a name is the same name whichever space the text typed.
_SPACES = str.maketrans({"\u00a0": " ", "\u2007": " ", "\u2009": " ", "\u202f": " "})


def extract_rules(chunk_id: str, text: str) -> ExtractionRecord:
    """One chunk's entities and relations by the rules above; never raises, never calls anything."""
    text = text.translate(_SPACES)
    ctx = _Context(text)
    entities: dict[str, ExtractedEntity] = {}
    relations: dict[tuple[str, str], ExtractedRelation] = {}
    person_surnames: dict[str, str] = {}
    confirmed: set[str] = set()
    sentences: list[tuple[str, list[_Span]]] = []
    for a, b in _sentence_spans(text):
        raw = text[a:b]
        if "`" in raw:
            raw = _ROLE_TEXT_RE.sub(_role_text, _LATEX_QUOTES_RE.sub(r"“\1” ", raw))
        sentence = _MARKUP_RE.sub(" ", raw).strip()
        sentence = _BULLET_RE.sub("", sentence, count=1)
        if len(sentence) < 2 or raw.lstrip().startswith("#") or _is_heading(sentence):
            continue
        spans = _name_spans(sentence, ctx)
        if spans:
            sentences.append((sentence, spans))
            # a chunk's first line that is a name alone, but for a note in brackets or a place after a comma
            # ("Illusions (1982 film)", "Nithiravilai"), is a title: it names what the chunk is about
            title = _TITLE_NOTE_RE.sub("", sentence) if a == 0 and text[b:b + 1] == "\n" else ""
            for sp in spans:
                if sp.type == "person" and " " in sp.name:
                    person_surnames.setdefault(sp.name.split()[-1], sp.name)
                if not sp.initial or sp.name == title:
                    confirmed.update(sp.name.split())
    # a lone capitalised word opening a sentence ("Crowds gathered") is a name only when the chunk also
    # capitalises it elsewhere, or it is a known surname or place
    # a chunk that lists many years or quantities (a chronology, a climate table) makes each a hub joining
    # unrelated chunks: there only full dates and names stay
    years = {sp.name for _, spans in sentences for sp in spans if sp.type == "date" and _YEAR_RE.match(sp.name)}
    many_years = len(years) >= MAX_CHUNK_FIGURES
    many_figures = sum(1 for _, spans in sentences for sp in spans if sp.type == "quantity") >= MAX_CHUNK_FIGURES
    sentences = [(sent, [sp for sp in spans if (not sp.initial or sp.name in confirmed or sp.name in person_surnames
                                                or sp.name.lower() in PLACES)
                         and not (many_years and sp.name in years) and not (many_figures and sp.type == "quantity")])
                 for sent, spans in sentences]
    for sentence, spans in sentences:
        desc = sentence if len(sentence) <= MAX_DESCRIPTION_CHARS else sentence[:MAX_DESCRIPTION_CHARS - 1] + "…"
        for sp in spans:
            # a lone surname after the full name in the same chunk is that person
            if " " not in sp.name and sp.name in person_surnames:
                sp.name, sp.type = person_surnames[sp.name], "person"
            key = sp.name.casefold()
            if key not in entities:
                entities[key] = ExtractedEntity(name=sp.name, type=sp.type, description=desc)
            elif entities[key].type == "unknown" and sp.type != "unknown":
                entities[key].type = sp.type
        for i, a in enumerate(spans):
            for k in range(i + 1, min(len(spans), i + 1 + PAIR_WINDOW)):
                b = spans[k]
                if a.name.casefold() == b.name.casefold():
                    continue
                if a.type in ("date", "quantity") and b.type in ("date", "quantity"):
                    continue
                pair = (a.name.casefold(), b.name.casefold())
                if pair in relations or pair[::-1] in relations:
                    continue
                # the words just before b (after the entity preceding it), so other names stay out
                between = sentence[spans[k - 1].end:b.start]
                if between.strip() in ("(", "(the", "") and sentence[b.end:b.end + 1] == ")":
                    predicate = "also known as"
                    words = []
                else:
                    words = _clean_phrase(between)
                    if len(words) > MAX_PREDICATE_WORDS:
                        words = words[-MAX_PREDICATE_WORDS:]
                    predicate = " ".join(words) or "related to"
                keywords = [w.lower() for w in words if w.lower() not in STOP_WORDS and not w.isdigit()][:4]
                relations[pair] = ExtractedRelation(src=a.name, tgt=b.name, predicate=predicate,
                                                    keywords=keywords, description=desc,
                                                    strength=1.0 if k == i + 1 else 0.5)
    return ExtractionRecord(chunk_id=chunk_id, extractor=RULES_FINGERPRINT, entities=list(entities.values()),
                            relations=list(relations.values()))

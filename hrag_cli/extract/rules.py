"""The offline extractor: regular expressions and capitalisation, no model, no network, deterministic.

Entities are capitalised multi-word names (with connectors such as "of", "de", "van", "the" kept inside),
acronyms, dates and numbers with units; their type comes from simple cues (name suffixes, titles, the word
before them). Relations join entities that share a sentence, with the words between them as the predicate.
It is the fast mode: good enough to build a navigable graph and to test the pipeline, far below an LLM in
precision (see README: limits of the rules extractor).
"""

from __future__ import annotations

import re
from functools import lru_cache

from hrag_cli.core.records import ExtractedEntity, ExtractedRelation, ExtractionRecord
from hrag_cli.core.textnorm import STOP_WORDS

RULES_FINGERPRINT = "rules-v3"

MAX_PREDICATE_WORDS = 6
MAX_DESCRIPTION_CHARS = 300
MAX_NAME_TOKENS = 7
PAIR_WINDOW = 3          # relate an entity to at most this many following entities of its sentence


def _upper_chars() -> str:
    return "".join(chr(c) for c in range(0x41, 0x2000) if chr(c).isupper())


_UP = "[" + re.escape(_upper_chars()) + "]"
_WORD_TAIL = r"[\w'’\-]*"
_CAP = rf"{_UP}{_WORD_TAIL}"
_CONNECTORS = ("of", "de", "del", "della", "der", "den", "van", "von", "la", "le", "du", "da", "di", "the",
               "y", "al", "el", "for", "and the")
_CONN = "(?:" + "|".join(re.escape(c) for c in sorted(_CONNECTORS, key=len, reverse=True)) + ")"

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
_UNITS = ("km|kilometres|kilometers|kilometre|kilometer|miles|mile|m|metres|meters|metre|meter|cm|mm|ft|feet|"
          "foot|inches|in|kg|kilograms|g|grams|tonnes|tons|tonne|ton|lb|lbs|pounds|litres|liters|l|ml|"
          "hectares|hectare|ha|acres|acre|%|per cent|percent|degrees|°C|°F|kW|MW|GW|kWh|MWh|V|km²|m²|m³|"
          "knots|mph|km/h|years|year|months|month|weeks|week|days|day|hours|hour|minutes|minute|"
          "people|workers|inhabitants|residents|members|employees|steps|volumes|ships|houses|"
          "million|billion|thousand|hundred")

_CURRENCY_REST = r"\s?\d[\d,]*(?:\.\d+)?(?:\s(?:million|billion|thousand))?"
_MONTH_REST = "|".join(m[1:] for m in _MONTHS.split("|"))

# One pass finds every candidate span. Each alternative is (kind, its first character, the rest); the
# pattern consumes the first character from one shared class and dispatches on it with a look-behind, which
# lets the regex engine skip quickly to candidate positions (several times faster than plain `\b...`
# alternatives). Earlier alternatives win: dates, then quantities, years, acronyms, names.
_ALTERNATIVES = [
    ("date", r"\d", rf"(?<![\w.,]\d)\d?\s(?:{_MONTHS})\.?,?\s\d{{3,4}}\b"),               # 8 May 1936
    ("date", "[JFMASOND]", rf"(?<![\w][JFMASOND])(?:{_MONTH_REST})\.?\s(?:\d{{1,2}},?\s)?\d{{4}}\b"),  # March 1987
    ("date", r"\d", r"(?<![\w.,]\d)\d{3}s\b"),                                             # 1930s
    ("quantity", "[$£€¥]", _CURRENCY_REST),                                                  # £4.2 million
    ("quantity", r"\d", rf"(?<![\w.,]\d)[\d,]*(?:\.\d+)?\s?(?:{_UNITS})(?!\w)"),             # 3,200 tonnes
    ("year", "[12]", r"(?<![\w.,][12])(?:(?<=1)\d{3}|(?<=2)0\d\d)\b(?![\w.,]\d)"),          # 1987
    ("acronym", "[A-Z]", r"(?<![\w'’][A-Z])[A-Z0-9&]*[A-Z][A-Z0-9]*s?\b"),                   # PESC
    ("name", _UP, rf"(?<![\w'’]{_UP}){_WORD_TAIL}(?:(?:\s+{_CONN})*\s+{_CAP})*"),          # Bank of Ellery
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
_MARKUP_RE = re.compile(r"[*_`#>|]+")
_WORD_RE = re.compile(r"[\w'’\-]+|[^\w\s]")
_POSSESSIVE_RE = re.compile(r"['’]s?$")
_SPACE_SPLIT_RE = re.compile(r"\S+")

_MONTH_WORDS = {m.lower() for m in _MONTHS.split("|")}
_WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
# Capitalised words that open sentences but are never names by themselves.
_COMMON_STARTERS = STOP_WORDS | {
    "however", "today", "yesterday", "tomorrow", "later", "although", "though", "meanwhile", "after", "before",
    "since", "during", "many", "most", "some", "several", "one", "two", "three", "four", "five", "first",
    "second", "third", "last", "next", "another", "every", "each", "both", "none", "yet", "still", "also",
    "instead", "now", "then", "thus", "hence", "there", "here", "once", "while", "when", "where", "what",
    "why", "how", "who", "whom", "which", "although", "despite", "because", "unlike", "like", "according",
    "following", "under", "over", "between", "among", "within", "without", "along", "across", "around",
    "near", "its", "his", "her", "their", "our", "my", "your", "this", "that", "these", "those", "a", "an",
    "the", "in", "on", "at", "by", "for", "from", "with", "as", "to", "of", "and", "but", "or", "nor", "so",
    "if", "it", "he", "she", "they", "we", "you", "i", "not", "no", "yes", "only", "even", "just", "all",
    "new", "old", "other", "such", "much", "more", "less", "few", "little", "great", "good", "bad", "don't",
    "walk", "climb", "eat", "watch", "see", "visit", "take", "book", "ask", "note", "read", "go", "use",
}

_ORG_WORDS = {
    "institute", "company", "council", "university", "authority", "archive", "archives", "works", "bank",
    "society", "board", "committee", "ministry", "department", "museum", "library", "school", "college",
    "corporation", "corp", "inc", "ltd", "association", "foundation", "agency", "party", "church", "guild",
    "union", "club", "trust", "press", "gazette", "times", "herald", "office", "court", "parliament",
    "assembly", "commission", "federation", "league", "group", "service", "police", "army", "navy",
    "hospital", "academy", "laboratory", "observatory", "consortium", "partners", "brothers", "co",
    "institution", "bureau", "senate", "government", "firm", "yard", "shipyard", "mill", "mills", "railway",
    "railways", "line", "lines", "orchestra", "theatre", "theater", "newspaper", "review", "journal",
}
_LOC_WORDS = {
    "island", "islands", "isle", "river", "port", "bay", "lake", "mount", "mountain", "mountains", "street",
    "road", "avenue", "lane", "harbour", "harbor", "coast", "valley", "city", "town", "village", "county",
    "province", "region", "district", "square", "flats", "sea", "ocean", "cape", "point", "hill", "hills",
    "forest", "strait", "sound", "peninsula", "steps", "quay", "dock", "docks", "marsh", "estuary", "delta",
    "gulf", "heights", "park", "gardens", "plain", "plains", "rocks", "head", "headland", "channel", "falls",
    "springs", "creek", "canyon", "desert", "state", "kingdom", "republic", "north", "south", "east", "west",
    "sankt", "san", "santa", "saint", "st", "fort", "glen", "moor", "ridge", "shore", "beach", "pass", "basin",
}
_EVENT_WORDS = {
    "flood", "war", "strike", "fire", "festival", "treaty", "conference", "election", "revolution", "battle",
    "storm", "earthquake", "expedition", "crisis", "riot", "riots", "exhibition", "olympics", "games",
    "uprising", "siege", "famine", "plague", "epidemic", "summit", "fair", "congress", "accord", "agreement",
    "disaster", "collapse", "rebellion", "referendum", "ceremony", "race", "cup", "championship", "act",
}
_ARTIFACT_WORDS = {
    "bridge", "lighthouse", "tower", "ship", "engine", "map", "maps", "manuscript", "codex", "lens", "canal",
    "dam", "station", "building", "hall", "cathedral", "chapel", "castle", "palace", "monument", "statue",
    "wall", "gate", "locomotive", "telescope", "book", "report", "atlas", "chronicle", "ledger", "barrier",
    "embankment", "terminal", "tunnel", "clock", "bell", "organ", "painting", "charter", "lock", "locks",
}
_PERSON_TITLES = {
    "mr", "mrs", "ms", "miss", "dr", "prof", "professor", "sir", "lady", "lord", "dame", "captain", "capt",
    "mayor", "king", "queen", "prince", "princess", "president", "judge", "father", "sister", "brother",
    "rev", "reverend", "general", "colonel", "governor", "senator", "chancellor", "minister", "bishop",
    "duke", "duchess", "countess", "baron", "baroness", "emperor", "empress",
}
# Titles that open a name ("Archduke Leopold of Austria"), and regnal numbers ("Maximilian I of Mexico").
_NAME_TITLES = _PERSON_TITLES | {"archduke", "archduchess", "grand", "infanta", "infante", "pope", "tsar", "czar",
                                 "sultan", "khan", "earl", "marquess", "margrave", "count", "viscount", "pharaoh"}
_REGNAL = {"i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x", "xi", "xii", "xiii", "xiv", "xv", "xvi"}
_AWARD_WORDS = {"award", "awards", "prize", "medal", "trophy", "fame", "honour", "honor", "order"}
_QUOTES_OPEN = "\"“‘'«"
_QUOTES_CLOSE = "\"”’'»"
_PERSON_CUE_WORDS = {
    "engineer", "archivist", "historian", "mayor", "director", "chairman", "chairwoman", "founder", "wife",
    "husband", "daughter", "son", "mother", "father", "captain", "professor", "student", "widow", "packer",
    "teacher", "scientist", "writer", "author", "architect", "lawyer", "doctor", "painter", "poet", "clerk",
    "keeper", "surveyor", "merchant", "journalist", "editor", "minister", "secretary", "president", "said",
    "told", "married", "born", "died", "hydrologist", "cartographer", "librarian", "curator", "politician",
}
_LOC_PREPOSITIONS = {"in", "at", "near", "from", "to", "into", "across", "outside", "around", "toward",
                     "towards", "off", "beyond", "via", "between"}


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
                if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
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


def _next_cue(after: str) -> str:
    """'life' when a birth or death date follows a name, 'adjective' when a lowercase content word does."""
    if _LIFE_RE.match(after):
        return "life"
    m = _NEXT_WORD_RE.match(after)
    return "adjective" if m and m.group(1) not in _COMMON_STARTERS else ""      # _COMMON_STARTERS holds STOP_WORDS


@lru_cache(maxsize=65536)
def _classify_name(name: str, prev_word: str, quoted: bool = False, next_cue: str = "") -> str:
    words = name.split()
    low = [w.lower().strip("'’") for w in words]
    last = low[-1]
    of = low.index("of") if "of" in low else len(low)
    if any(w in _AWARD_WORDS for w in low[:of]):
        return "award"
    if quoted:                  # a quoted title in running text: a song, album, film, book, episode
        return "work"
    if next_cue == "life":
        return "person"
    if last in _ORG_WORDS or any(w in _ORG_WORDS for w in low[:of]):
        return "organization"
    if low[0] in _NAME_TITLES or (len(low) > 1 and low[1] in _REGNAL):
        return "person"
    if last in _EVENT_WORDS or low[0] in _EVENT_WORDS:
        return "event"
    if last in _ARTIFACT_WORDS:
        return "artifact"
    if low[0] in _LOC_WORDS or last in _LOC_WORDS:
        return "location"
    if prev_word in _PERSON_TITLES:
        return "person"
    if len(words) in (2, 3) and not any(w in _CONNECTORS for w in low):
        return "person"
    if 0 < of <= 2 and words[0][:1].isupper() and len(words) > of + 1:
        return "person"         # "Maria of Nassau", "William Louis of Anhalt": the place words were tested above
    if next_cue == "adjective" and len(words) == 1 and (prev_word in ("a", "an") or last.endswith(_DEMONYM_ENDINGS)):
        return "nationality"
    if prev_word in _LOC_PREPOSITIONS:
        return "location"
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


def _name_spans(sentence: str, lower_words: set[str]) -> list[_Span]:
    spans: list[_Span] = []
    stripped = sentence.lstrip()
    lead = len(sentence) - len(stripped)
    for m in _TOKEN_RE.finditer(sentence):
        kind = _GROUP_KIND[m.lastgroup or ""]
        s, e = m.start(), m.end()
        text = m.group(0)
        if kind == "date" or kind == "year":
            spans.append(_Span(s, e, text, "date"))
            continue
        if kind == "quantity":
            spans.append(_Span(s, e, text, "quantity"))
            continue
        if kind == "acronym":
            if len(text) >= 2 and text.lower() not in ("i",):
                spans.append(_Span(s, e, text, "organization"))
            continue
        # a capitalised name: drop sentence-initial common words ("The", "After") and trailing possessives
        toks = [(w.start(), w.end(), w.group(0)) for w in _SPACE_SPLIT_RE.finditer(text)]
        at_start = s <= lead
        i, j = 0, len(toks)
        while i < j and (at_start or j - i > 1) and toks[i][2].lower().strip("'’") in _COMMON_STARTERS:
            i += 1
            at_start = False
            while i < j and toks[i][2] in _CONNECTORS:     # connectors left dangling after the dropped word
                i += 1
        while j > i and toks[j - 1][2] in _CONNECTORS:
            j -= 1
        if i >= j:
            continue
        title = j - i > 1 and toks[i][2].lower().rstrip(".") in _PERSON_TITLES
        if title:                                          # "Mrs Calloway" -> person "Calloway"
            i += 1
        words = [t[2] for t in toks[i:j]]
        last = _POSSESSIVE_RE.sub("", words[-1]) or words[-1]
        trim = len(words[-1]) - len(last)
        words[-1] = last
        s, e = m.start() + toks[i][0], m.start() + toks[j - 1][1] - trim
        name = " ".join(words)
        low0 = words[0].lower()
        if len(words) == 1:
            if len(name) < 2 or low0 in _MONTH_WORDS or low0 in _WEEKDAYS:
                continue
            if s <= lead and (low0 in _COMMON_STARTERS or low0 in lower_words):
                continue
            if low0 in lower_words and low0 in _COMMON_STARTERS:
                continue
        if len(words) > MAX_NAME_TOKENS:
            continue
        prev = sentence[max(0, s - 24):s].split()
        prev_word = _POSSESSIVE_RE.sub("", prev[-1].lower().strip(".,;:")) if prev else ""
        quoted = s > 0 and sentence[s - 1] in _QUOTES_OPEN and sentence[e:e + 1] in _QUOTES_CLOSE
        type_ = "person" if title else _classify_name(name, prev_word, quoted, _next_cue(sentence[e:e + 24]))
        spans.append(_Span(s, e, name, type_, initial=len(words) == 1 and s <= lead))
    return spans


def _is_heading(sentence: str) -> bool:
    """Title-case lines (headlines, headings) repeat what the body says and glue names together."""
    if sentence.rstrip()[-1:] in ".!?\"”":
        return False
    words = [w for w in sentence.split() if w[0].isalpha()]
    if len(words) < 4:
        return False
    caps = sum(1 for w in words if w[0].isupper())
    return caps >= 3 and all(w[0].isupper() or w.lower() in STOP_WORDS for w in words)


def extract_rules(chunk_id: str, text: str) -> ExtractionRecord:
    """One chunk's entities and relations by the rules above; never raises, never calls anything."""
    lower_words = {w for w in re.findall(r"\b[a-z][a-z'’\-]+\b", text)}
    entities: dict[str, ExtractedEntity] = {}
    relations: dict[tuple[str, str], ExtractedRelation] = {}
    person_surnames: dict[str, str] = {}
    confirmed: set[str] = set()
    sentences: list[tuple[str, list[_Span]]] = []
    for a, b in _sentence_spans(text):
        raw = text[a:b]
        sentence = _MARKUP_RE.sub(" ", raw).strip()
        sentence = _BULLET_RE.sub("", sentence, count=1)
        if len(sentence) < 2 or raw.lstrip().startswith("#") or _is_heading(sentence):
            continue
        spans = _name_spans(sentence, lower_words)
        if spans:
            sentences.append((sentence, spans))
            for sp in spans:
                if sp.type == "person" and " " in sp.name:
                    person_surnames.setdefault(sp.name.split()[-1], sp.name)
                if not sp.initial:
                    confirmed.update(sp.name.split())
    # a lone capitalised word opening a sentence ("Crowds gathered") is a name only when the chunk also
    # capitalises it elsewhere or it is a known surname
    sentences = [(sent, [sp for sp in spans if not sp.initial or sp.name in confirmed or sp.name in person_surnames])
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

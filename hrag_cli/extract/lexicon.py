"""The words the rules extractor reads names by: the head words that type a name (an organisation's, a place's,
an event's, a thing's), titles and offices before a person's name, honours after it, and the function words
that never make a name.

Closed classes of English, not names of any data set: what the rules in `rules.py` test a capitalised run's
words against.
"""

from __future__ import annotations

from hrag_cli.core.textnorm import STOP_WORDS
from hrag_cli.extract.gazetteer import DEMONYMS

# Capitalised words that open sentences but are never names by themselves.
COMMON_STARTERS = STOP_WORDS | {
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

ORG_WORDS = {
    "institute", "company", "council", "university", "authority", "archive", "archives", "works", "bank",
    "society", "board", "committee", "ministry", "department", "museum", "library", "school", "college",
    "corporation", "corp", "inc", "ltd", "association", "foundation", "agency", "party", "church", "guild",
    "union", "club", "trust", "press", "gazette", "times", "herald", "office", "court", "parliament",
    "assembly", "commission", "federation", "league", "group", "service", "police", "army", "navy",
    "hospital", "academy", "laboratory", "observatory", "consortium", "partners", "brothers", "co",
    "institution", "bureau", "senate", "government", "firm", "yard", "shipyard", "mill", "mills", "railway",
    "railways", "line", "lines", "hotels", "resorts", "records", "studios", "airlines", "orchestra", "theatre",
    "theater", "newspaper", "review", "journal", "organisation", "organization", "alliance", "confederation",
    "coalition", "movement", "directorate", "secretariat", "division", "centre", "center",
}

LOC_WORDS = {
    "island", "islands", "isle", "river", "port", "bay", "lake", "mount", "mountain", "mountains", "street",
    "road", "avenue", "lane", "harbour", "harbor", "coast", "valley", "city", "town", "village", "county",
    "province", "region", "district", "square", "flats", "sea", "ocean", "cape", "point", "hill", "hills",
    "forest", "strait", "sound", "peninsula", "steps", "quay", "dock", "docks", "marsh", "estuary", "delta",
    "gulf", "heights", "park", "gardens", "plain", "plains", "rocks", "head", "headland", "channel", "falls",
    "springs", "creek", "canyon", "desert", "state", "kingdom", "republic", "north", "south", "east", "west",
    "sankt", "san", "santa", "saint", "st", "fort", "glen", "moor", "ridge", "shore", "beach", "pass", "basin",
    "states", "emirates",
}

EVENT_WORDS = {
    "flood", "war", "strike", "fire", "festival", "treaty", "conference", "election", "revolution", "battle",
    "storm", "earthquake", "expedition", "crisis", "riot", "riots", "exhibition", "olympics", "games",
    "uprising", "siege", "famine", "plague", "epidemic", "summit", "fair", "congress", "accord", "agreement",
    "disaster", "collapse", "rebellion", "referendum", "ceremony", "race", "cup", "championship", "act",
}

ARTIFACT_WORDS = {
    "bridge", "lighthouse", "tower", "ship", "engine", "map", "maps", "manuscript", "codex", "lens", "canal",
    "dam", "station", "building", "hall", "cathedral", "chapel", "castle", "palace", "monument", "statue",
    "wall", "gate", "locomotive", "telescope", "book", "report", "atlas", "chronicle", "ledger", "barrier",
    "embankment", "terminal", "tunnel", "clock", "bell", "organ", "painting", "charter", "lock", "locks",
}

PERSON_TITLES = {
    "mr", "mrs", "ms", "miss", "dr", "prof", "professor", "sir", "lady", "lord", "dame", "captain", "capt",
    "mayor", "king", "queen", "prince", "princess", "president", "judge", "father", "sister", "brother",
    "rev", "reverend", "general", "colonel", "governor", "senator", "chancellor", "minister", "bishop",
    "duke", "duchess", "countess", "baron", "baroness", "emperor", "empress",
}

# Royal and noble styles are part of how a person is named ("King Albert II", "Sir Henry Wellcome"); offices
# and forms of address are not ("President Bill Clinton", "Mr. Collins").
STYLES = {"king", "queen", "prince", "princess", "lord", "lady", "sir", "dame", "duke", "duchess", "emperor",
          "empress", "baron", "baroness", "countess"}

# Titles that open a name ("Archduke Leopold of Austria"), and regnal numbers ("Maximilian I of Mexico").
NAME_TITLES = PERSON_TITLES | {"archduke", "archduchess", "grand", "infanta", "infante", "pope", "tsar", "czar",
                                "sultan", "khan", "earl", "marquess", "margrave", "count", "viscount", "pharaoh"}

REGNAL = {"i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x", "xi", "xii", "xiii", "xiv", "xv", "xvi"}

AWARD_WORDS = {"award", "awards", "prize", "medal", "trophy", "fame", "honour", "honor", "order"}

LOC_PREPOSITIONS = {"in", "at", "near", "from", "to", "into", "across", "outside", "around", "toward",
                    "towards", "off", "beyond", "via", "between"}

# Heads whose complement after "on" belongs to the name: "Treaty on European Union", "Committee on Antarctic
# Names", "War on Terror". After other words "on" starts a phrase of its own ("Smith on Monday").
ON_HEADS = {"treaty", "convention", "committee", "commission", "board", "conference", "council", "war",
            "agreement", "declaration", "protocol", "act", "institute", "center", "centre", "campaign", "panel",
            "symposium", "workshop", "forum", "task", "force", "subcommittee"}

# Possessors that make a descriptive genitive inside a name: a plural ("People's Republic", "Children's Hospital"),
# a title standing for the Crown ("King's College"); and the saints that name churches ("St Paul's Cathedral").
GROUP_POSSESSORS = {"people", "children", "women", "men", "king", "queen"}

SAINTS = {"st", "st.", "saint", "ste", "ste."}

# Two demonyms that name one denomination or people: "Roman Catholic", "African American".
COMPOUND_DEMONYMS = {("roman", "catholic"), ("anglo", "saxon"), ("greek", "orthodox"), ("russian", "orthodox")}
COMPOUND_DEMONYMS |= {(d, "american") for d in DEMONYMS}

# Offices (and a film credit) before a person's name, after the words that say which office: "Prime Minister
# Margaret Thatcher", "U.S. Senator Pat Harrison".
ROLE_NOUNS = {"president", "minister", "secretary", "governor", "senator", "senators", "justice", "premier",
              "premiers", "chancellor", "leader", "chairman", "chairwoman", "ambassador", "mayor", "judge",
              "commissioner", "director", "representative", "congressman", "congresswoman", "speaker", "treasurer",
              "admiral", "coach", "manager", "owner", "founder", "ceo", "starring", "presidents",
              "ministers", "governors", "judges", "mayors", "directors", "captain", "marshal", "sheriff"}

# Honours and memberships written after a person's name ("Mark Achtman FRS"): not part of the name.
POSTNOMINALS = {"CBE", "OBE", "MBE", "KBE", "GBE", "DBE", "FRS", "FRSE", "FBA", "QC", "KC", "VC", "PC", "MP",
                "MEP", "AC", "AO", "CIE", "CSI", "KCB", "GCB", "DSO", "MC", "JP", "MVO", "KCMG", "GCMG", "CMG"}

# Nouns that open an article's title about something else: "History of Maryland" is about Maryland.
TOPIC_NOUNS = {"list", "lists", "history", "economy", "climate", "geography", "demographics", "politics", "culture",
               "timeline", "outline", "index", "glossary", "music", "sport", "sports", "religion", "transport",
               "education", "tourism"}

# The parts of a document: "Table 3", "Volume 59" refer to a place in a text, not to a thing.
DOCUMENT_PARTS = {"figure", "fig", "fig.", "table", "section", "chapter", "appendix", "page", "part", "volume",
                  "vol", "vol.", "issue", "no", "no.", "contents", "step", "line", "lines", "equation", "eq"}

# Words that are never a name alone, in any case ("NEVER", "Also"): function words, modals, quantifiers.
FUNCTION_WORDS = COMMON_STARTERS | {
    "never", "always", "ever", "may", "might", "must", "shall", "can", "cannot", "will", "would", "should",
    "could", "yes", "ok", "okay", "please", "etc", "via", "per", "upon", "unless", "whether", "either", "neither",
    "any", "every", "none", "nothing", "something", "anything", "everything", "otherwise", "else", "perhaps",
    "maybe", "thus", "therefore", "hence", "whereas", "whatever", "whenever", "wherever", "us", "them", "him",
    "me", "mine", "hers", "ours", "theirs", "itself", "yourself", "see", "note", "warning", "tip", "example",
    # the parts of a document and bare units: "Figure 3", "Table", "MB" name no thing of their own
    "figure", "fig", "table", "section", "chapter", "appendix", "page", "part", "proceedings", "abstract",
    "introduction", "conclusion", "conclusions", "references", "acknowledgements", "acknowledgments",
    "kb", "mb", "gb", "tb", "ms", "ns", "hz", "khz", "mhz", "ghz"}

# Adjectives that open names ("New York", "First World War", "Great Britain"): dropped only when alone.
NAME_OPENERS = {"new", "old", "first", "second", "third", "last", "great", "good", "little", "one", "two", "three",
                "four", "five", "next", "all", "little", "little"}

PREPOSITIONS = {"after", "before", "in", "on", "at", "from", "since", "during", "under", "over", "between",
                "among", "within", "without", "near", "by", "with", "as", "to", "of", "for", "into", "through",
                "until", "upon", "across", "against", "throughout", "following", "despite"}

# A name never ends on an article: "Parliament The" is a name run into the next sentence. Other capitalised
# function words end titles ("Changed It", "Come Dance With Me").
TRAILING_WORDS = {"the", "a", "an"}

PERSON_VERBS = {"said", "says", "wrote", "sang", "died", "married", "told", "starred", "played"}

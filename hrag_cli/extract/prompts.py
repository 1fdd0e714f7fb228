"""Prompt text for every LLM call hrag makes.

All prompt wording lives here so that one constant, PROMPT_VERSION, can stand for it in the extractor
fingerprint: editing any extraction prompt must bump it, which makes cached extractions stale.
The chunk text always goes in the *last* user turn, after a fixed system message, so providers that cache
prompt prefixes can reuse the long instructions across chunks.
"""

from __future__ import annotations

import json
from typing import Any

PROMPT_VERSION: str = "hrag-extract-v2"

FIELD_DELIMITER: str = "<|#|>"
COMPLETION_MARKER: str = "<|COMPLETE|>"

DEFAULT_ENTITY_TYPES: list[str] = [
    "person",
    "organization",
    "location",
    "event",
    "artifact",
    "concept",
    "date",
    "quantity",
]

# A made-up passage (not taken from any dataset) and the output we expect for it. It shows every field,
# a multi-word predicate, dates/quantities as entities, and the completion marker.
_EXAMPLE_TEXT = (
    "In 1911 the engineer Marta Vidal lit the first lamp of the Corvo Point lighthouse for the Harbour "
    "Board of Santa Luzia. The lens was ground by the glassworks Irmãos Faria (the Faria Brothers) in Braga "
    "and could be seen "
    "from 40 kilometres out at sea."
)

_D = FIELD_DELIMITER
_EXAMPLE_OUTPUT = "\n".join(
    [
        f"entity{_D}Marta Vidal{_D}person{_D}Engineer who lit the first lamp of the Corvo Point lighthouse in 1911.",
        f"entity{_D}Corvo Point lighthouse{_D}artifact{_D}Lighthouse of the Harbour Board of Santa Luzia, first lit in 1911; its light was visible 40 kilometres out at sea.",
        f"entity{_D}Harbour Board of Santa Luzia{_D}organization{_D}Port authority for which the Corvo Point lighthouse was put into service.",
        f"entity{_D}Irmãos Faria{_D}organization{_D}Glassworks in Braga that ground the lens of the Corvo Point lighthouse.{_D}Faria Brothers",
        f"entity{_D}Braga{_D}location{_D}Town where the glassworks Irmãos Faria is located.",
        f"entity{_D}1911{_D}date{_D}Year the Corvo Point lighthouse was first lit.",
        f"entity{_D}40 kilometres{_D}quantity{_D}Distance from which the Corvo Point lighthouse could be seen at sea.",
        f"relation{_D}Marta Vidal{_D}Corvo Point lighthouse{_D}lit the first lamp of{_D}commissioning, engineering{_D}Marta Vidal put the Corvo Point lighthouse into service by lighting its first lamp.{_D}9",
        f"relation{_D}Corvo Point lighthouse{_D}Harbour Board of Santa Luzia{_D}was operated for{_D}ownership, port authority{_D}The lighthouse was lit on behalf of the Harbour Board of Santa Luzia.{_D}7",
        f"relation{_D}Irmãos Faria{_D}Corvo Point lighthouse{_D}ground the lens of{_D}manufacturing, optics{_D}The glassworks Irmãos Faria made the lighthouse's lens.{_D}8",
        f"relation{_D}Irmãos Faria{_D}Braga{_D}is located in{_D}location{_D}The glassworks Irmãos Faria is in Braga.{_D}6",
        f"relation{_D}Corvo Point lighthouse{_D}1911{_D}was first lit in{_D}opening date{_D}The lighthouse first shone in 1911.{_D}7",
        f"relation{_D}Corvo Point lighthouse{_D}40 kilometres{_D}was visible from{_D}range, visibility{_D}The light could be seen from 40 kilometres away.{_D}5",
        COMPLETION_MARKER,
    ]
)

def worked_example() -> tuple[str, str]:
    """(passage, output) of the extraction prompt's worked example: what a model may copy instead of
    reading the chunk (extract/checks.py drops such copies)."""
    return _EXAMPLE_TEXT, _EXAMPLE_OUTPUT


# Rules both extraction prompts share, word for word.
_NAME_RULE = """- NAME: copy the name exactly as it is written in the passage (same spelling, language and capitalisation). Use the fullest form the passage gives, and use that same form everywhere in your output. Do not translate names."""
_ENTITY_DESC_RULE = """- DESCRIPTION: one or two self-contained sentences saying what the passage tells us about the entity. Use only facts from the passage.
- ALIASES: other names the passage itself uses for the same entity (a short form, an abbreviation, a translation, a former name), separated by semicolons. Leave the field out when there are none, and never list a different entity."""
_ENDPOINT_RULE = """- Extract every relation the passage states or clearly implies between two of the entities you listed. Both SOURCE and TARGET must be names you listed as entities, written identically."""
_RELATION_TAIL = """- KEYWORDS: a few comma-separated words or short phrases naming the general theme of the relation.
- DESCRIPTION: one sentence explaining how the two are related, based on the passage.
- STRENGTH: an integer from 1 (weak or incidental) to 10 (central, explicitly stated).
- Do not relate an entity to itself. Skip relations you would have to guess."""
_FORMAT_HEAD = f"""- One record per line, fields separated by the delimiter {FIELD_DELIMITER}, with no other text, numbering, bullets, quotes or markdown:
entity{FIELD_DELIMITER}NAME{FIELD_DELIMITER}TYPE{FIELD_DELIMITER}DESCRIPTION{FIELD_DELIMITER}ALIASES"""
_FORMAT_TAIL = f"""- Never use the delimiter inside a field, and never split a record over several lines.
- List all entities first, then all relations.
- After the last record write {COMPLETION_MARKER} on its own line."""


_EXTRACTION_SYSTEM = f"""You build a knowledge graph from text. From the passage the user gives you, list the entities it mentions and the relations it states between them.

ENTITIES
- Extract every clearly identifiable entity whose type is one of the allowed types. If something important fits none of them, use the closest type.
{_NAME_RULE}
- TYPE: exactly one of the allowed types, in lowercase.
{_ENTITY_DESC_RULE}

RELATIONS
{_ENDPOINT_RULE}
- PREDICATE: a short verb phrase read from SOURCE to TARGET, such as "founded", "was born in", "is part of", "acquired". Lowercase unless it contains a proper name.
{_RELATION_TAIL}

OUTPUT FORMAT
{_FORMAT_HEAD}
relation{FIELD_DELIMITER}SOURCE{FIELD_DELIMITER}TARGET{FIELD_DELIMITER}PREDICATE{FIELD_DELIMITER}KEYWORDS{FIELD_DELIMITER}DESCRIPTION{FIELD_DELIMITER}STRENGTH
{_FORMAT_TAIL}

EXAMPLE
Allowed types: person, organization, location, event, artifact, concept, date, quantity
Passage:
{_EXAMPLE_TEXT}

Output:
{_EXAMPLE_OUTPUT}
"""


# The schema prompt (a schema file is given): the user's types with their descriptions go in the system message
# (the same for every chunk, so prefix caching still works) and each relation row carries a relation type.
SCHEMA_PROMPT_VERSION: str = "hrag-extract-schema-v2"

_EXAMPLE_SCHEMA = """Entity types:
- person: A human being.
- organization: A company, authority or other body.
- artifact: A made object, building or machine.
- location: A named place.
Relation types:
- commissioned: A person puts an artifact into service. (person -> artifact)
- made: An organization manufactures an artifact. (organization -> artifact)
- serves: An artifact is run for an organization. (artifact -> organization)
- located_in: Something is situated in a place. (organization -> location, artifact -> location)"""

_EXAMPLE_TYPED_OUTPUT = "\n".join(
    [
        *_EXAMPLE_OUTPUT.split("\n")[:5],
        f"relation{_D}Marta Vidal{_D}Corvo Point lighthouse{_D}commissioned{_D}lit the first lamp of{_D}commissioning, engineering{_D}Marta Vidal put the Corvo Point lighthouse into service by lighting its first lamp.{_D}9",
        f"relation{_D}Corvo Point lighthouse{_D}Harbour Board of Santa Luzia{_D}serves{_D}was operated for{_D}ownership, port authority{_D}The lighthouse was lit on behalf of the Harbour Board of Santa Luzia.{_D}7",
        f"relation{_D}Irmãos Faria{_D}Corvo Point lighthouse{_D}made{_D}ground the lens of{_D}manufacturing, optics{_D}The glassworks Irmãos Faria made the lighthouse's lens.{_D}8",
        f"relation{_D}Irmãos Faria{_D}Braga{_D}located_in{_D}is located in{_D}location{_D}The glassworks Irmãos Faria is in Braga.{_D}6",
        COMPLETION_MARKER,
    ]
)


def _schema_listing(schema: Any) -> str:
    """The schema as the prompt shows it: one line per type with its description, relation patterns after."""
    lines = ["Entity types:"]
    for t in schema.entities:
        props = f" Properties worth describing: {', '.join(t.properties)}." if t.properties else ""
        lines.append(f"- {t.name}: {t.description}{props}")
    if schema.relations:
        lines.append("Relation types:")
    for r in schema.relations:
        pairs = ", ".join(f"{a} -> {b}" for a, b in r.patterns) or "any two entity types"
        props = f" Properties worth describing: {', '.join(r.properties)}." if r.properties else ""
        lines.append(f"- {r.name}: {r.description} ({pairs}){props}")
    return "\n".join(lines)


def _schema_system(schema: Any) -> str:
    typed = bool(schema.relations)
    rel_type_field = f"{FIELD_DELIMITER}RELATION_TYPE" if typed else ""
    rel_type_rule = ("- RELATION_TYPE: the one relation type of the schema that the relation is an instance of, "
                     "and whose (source type -> target type) pairs fit the types of SOURCE and TARGET. Skip a "
                     "relation that no relation type fits.\n") if typed else ""
    rows = _EXAMPLE_OUTPUT.split("\n")   # untyped: the rows among the example schema's four entity types
    example = _EXAMPLE_TYPED_OUTPUT if typed else "\n".join([*rows[:5], *rows[7:11], COMPLETION_MARKER])
    example_schema = _EXAMPLE_SCHEMA if typed else _EXAMPLE_SCHEMA.split("\nRelation types:")[0]
    return f"""You build a knowledge graph of the kinds of things the schema below names. From the passage the user gives you, list the entities of those types it mentions and the relations it states between them.

SCHEMA
{_schema_listing(schema)}

ENTITIES
- Extract every clearly identifiable entity whose type is one of the schema's entity types. Leave out anything that fits none of them.
{_NAME_RULE}
- TYPE: exactly one of the schema's entity type names, as written above.
{_ENTITY_DESC_RULE}

RELATIONS
{_ENDPOINT_RULE}
{rel_type_rule}- PREDICATE: a short verb phrase read from SOURCE to TARGET in the passage's own terms, such as "founded", "was born in", "acquired". Lowercase unless it contains a proper name.
{_RELATION_TAIL}

OUTPUT FORMAT
{_FORMAT_HEAD}
relation{FIELD_DELIMITER}SOURCE{FIELD_DELIMITER}TARGET{rel_type_field}{FIELD_DELIMITER}PREDICATE{FIELD_DELIMITER}KEYWORDS{FIELD_DELIMITER}DESCRIPTION{FIELD_DELIMITER}STRENGTH
{_FORMAT_TAIL}

EXAMPLE (with its own small schema; for your answer use only the SCHEMA above)
{example_schema}
Passage:
{_EXAMPLE_TEXT}

Output:
{example}
"""


def build_extraction_messages(
    chunk_text: str, entity_types: list[str], language: str = "English", schema: Any = None,
    fmt: str = "delimited", hints: list[str] | None = None,
) -> list[dict]:
    """System + user messages asking for the entity/relation lines of one chunk (our `<|#|>` format), or for
    one JSON object (`fmt` "json"); with a schema (extract/schema.Schema) the system message carries its types
    and relation rows a relation type. `hints` (a list, even empty): candidate names for the model to check,
    correct and complete, given before the passage."""
    hint = f"{hints_line(hints)}\n\n" if hints is not None else ""
    if fmt == "json":
        types_line = (f"Allowed types (the schema):\n{_schema_listing(schema)}" if schema is not None else
                      "Allowed types: " + (", ".join(t.strip() for t in entity_types if t.strip())
                                           or ", ".join(DEFAULT_ENTITY_TYPES)))
        system = _json_system(types_line, bool(schema is not None and schema.relations), hints is not None)
        user = (f"Write descriptions and predicates in {language}; keep names exactly as they appear "
                f"in the passage.\n\n{hint}Passage:\n{chunk_text}\n\nOutput:")
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]
    if schema is not None:
        head, system = "", _schema_system(schema)
    else:
        types = ", ".join(t.strip() for t in entity_types if t.strip()) or ", ".join(DEFAULT_ENTITY_TYPES)
        head, system = f"Allowed types: {types}\n", _EXTRACTION_SYSTEM
    if hints is not None:
        system = f"{system}\nCANDIDATES\n{_HINTS_RULE}\n"
    user = (
        f"{head}"
        f"Write every DESCRIPTION, PREDICATE and KEYWORDS field in {language}; keep NAMES exactly as they "
        f"appear in the passage.\n\n"
        f"{hint}Passage:\n{chunk_text}\n\n"
        f"Output:"
    )
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]


# -- the JSON format (structured output) -------------------------------------------------------------------------
JSON_PROMPT_VERSION: str = "hrag-extract-json-v2"

# The worked example as the JSON answer shows it (the same made-up facts as the delimited example). Short entity
# descriptions and three fields a relation: every answer token costs a small local model a fraction of a second.
_JSON_EXAMPLE = {
    "entities": [
        {"name": "Marta Vidal", "type": "person", "description": "engineer who lit the lighthouse's first lamp"},
        {"name": "1911", "type": "date", "description": "year the lighthouse was first lit"},
        {"name": "Corvo Point lighthouse", "type": "artifact", "description": "lighthouse of the Harbour Board of Santa Luzia"},
        {"name": "Harbour Board of Santa Luzia", "type": "organization", "description": "port authority the lighthouse served"},
        {"name": "Irmãos Faria", "type": "organization", "description": "glassworks in Braga that ground the lens", "aliases": ["Faria Brothers"]},
        {"name": "Braga", "type": "location", "description": "town of the glassworks"},
        {"name": "40 kilometres", "type": "quantity", "description": "distance from which the light could be seen"},
    ],
    "relations": [
        {"source": "Marta Vidal", "predicate": "lit the first lamp of", "target": "Corvo Point lighthouse"},
        {"source": "Corvo Point lighthouse", "predicate": "was first lit in", "target": "1911"},
        {"source": "Irmãos Faria", "predicate": "ground the lens of", "target": "Corvo Point lighthouse"},
        {"source": "Irmãos Faria", "predicate": "is located in", "target": "Braga"},
    ],
}

# What a rule-based tagger might propose for the example passage: a name cut short, two run together, a
# common word, a wrong split; the answer above shows them corrected.
_EXAMPLE_HINTS = ["Marta Vidal", "Corvo Point", "Harbour Board", "Santa Luzia", "Irmãos Faria", "Faria Brothers",
                  "Braga", "1911", "The"]

HINTS_PROMPT_VERSION: str = "hrag-extract-hints-v2"

_HINTS_RULE = """The passage comes with "Candidates": names a simple rule-based tagger found in it. The tagger finds most names, but it cuts some short, runs some together, picks up some ordinary words, and misses some. The candidates are kept beside your entities, except one inside a longer name you write. So check each candidate against the passage: where it is cut short or runs two names together, write the full name or names as the passage writes them; list every name you find, candidates included, with its own type and description; then add every name the tagger missed. A name never includes a bracketed part: "Paris (France)" is two names."""


def hints_line(names: list[str]) -> str:
    """The candidate names put before the passage when [extract] hints is on."""
    return "Candidates: " + ("; ".join(names) if names else "(none)")


def _json_system(types_line: str, typed: bool, hints: bool) -> str:
    rel_type = ('"relation_type" (the schema relation type it is an instance of, fitting the types of both '
                'ends), ') if typed else ""
    example = json.dumps(_JSON_EXAMPLE, ensure_ascii=False)
    rule = f"\n{_HINTS_RULE}" if hints else ""
    shown = f"\n{hints_line(_EXAMPLE_HINTS)}" if hints else ""
    return f"""You turn a passage into a small knowledge graph. Answer with one JSON object holding two lists, "entities" and "relations".

"entities": every named thing in the passage, each listed once: people, organizations, places, creative works (books, films, songs, albums, journals), events, awards and titles, dates and years, and numbers with units. Copy each name exactly as the passage writes it, in its fullest form. Give each a "type" (one of the allowed types) and a short "description" (at most 12 words) of what the passage says about it; add "aliases" only for other names the passage uses for the same thing.
"relations": facts the passage states between two of your entities, each as "source", {rel_type}"predicate" (a short verb phrase such as "was born in" or "founded") and "target". Source and target must be names from your entity list, written the same way.
Use only what the passage says.{rule}
{types_line}

Example{shown}
Passage: {_EXAMPLE_TEXT}
Answer: {example}"""


def extraction_schema(types: list[str], relation_types: list[str] | None = None, entities: int = 40,
                      relations: int = 40) -> dict:
    """The JSON schema of an extraction answer: the entity types (and a schema's relation types) as enums, and
    at most `entities` entities and `relations` relations, so a model that starts repeating itself stops at
    the list's end."""
    entity = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 120},
        "type": {"type": "string", "enum": list(types)},
        "description": {"type": "string", "maxLength": 120},
        "aliases": {"type": "array", "items": {"type": "string", "maxLength": 120}, "maxItems": 5}},
        "required": ["name", "type", "description"]}
    rel_props: dict[str, Any] = {"source": {"type": "string", "maxLength": 120}}
    if relation_types:
        rel_props["relation_type"] = {"type": "string", "enum": list(relation_types)}
    rel_props.update({"predicate": {"type": "string", "maxLength": 80},
                      "target": {"type": "string", "maxLength": 120}})
    relation = {"type": "object", "properties": rel_props, "required": list(rel_props)}
    return {"type": "object",
            "properties": {"entities": {"type": "array", "items": entity, "maxItems": entities},
                           "relations": {"type": "array", "items": relation, "maxItems": relations}},
            "required": ["entities", "relations"]}


def build_gleaning_message(fmt: str = "delimited") -> dict:
    """The user turn appended after the model's answer to ask for what it missed (a gleaning round)."""
    if fmt == "json":
        return {"role": "user", "content": (
            "Some entities and relations in the passage were probably missed. Read it again and answer with a "
            "JSON object of the same shape holding only entities and relations you have not listed yet; empty "
            "lists if nothing was missed.")}
    content = (
        "Some entities and relations in the passage were probably missed. Read the passage again and output "
        "only records that are new, or records whose description you can make clearly more complete; do not "
        "repeat records unchanged. Every relation must connect names listed as entities (in this answer or "
        "the previous one). Use exactly the same line format and delimiter as before, and finish with "
        f"{COMPLETION_MARKER} on its own line. If nothing was missed, output only {COMPLETION_MARKER}."
    )
    return {"role": "user", "content": content}


def build_continuation_message(fmt: str = "delimited") -> dict:
    """The user turn appended after an answer cut at max_tokens, to get the rest of it (a continuation round)."""
    if fmt == "json":
        return {"role": "user", "content": (
            "Your answer was cut off by the length limit. Answer with a new JSON object of the same shape "
            "holding only the entities and relations you had not finished listing.")}
    content = (
        "Your answer was cut off by the length limit. Continue it: output the remaining records, starting "
        "again with the record that was cut off, without repeating the complete records above. Use exactly the "
        f"same line format and delimiter, and finish with {COMPLETION_MARKER} on its own line."
    )
    return {"role": "user", "content": content}


def build_summary_messages(
    kind: str, name: str, fragments: list[str], target_tokens: int, language: str
) -> list[dict]:
    """Messages to merge several descriptions of one entity or relation into one (resolve stage)."""
    what = "relation between" if kind.startswith("rel") else "entity"
    listing = "\n".join(f"- {f.strip()}" for f in fragments if f and f.strip())
    system = (
        "You merge descriptions collected from different passages into one consistent description. "
        "Keep every distinct fact, drop repetitions, and where descriptions contradict each other say so "
        "briefly instead of choosing one. Use only the information given. Write plain prose in the third "
        "person, without lists, headings or an introduction."
    )
    user = (
        f"Merge these descriptions of the {what} {name}.\n"
        f"Write in {language}, in at most about {max(int(target_tokens), 16)} tokens, and mention the name "
        f"so the description stands on its own.\n\n"
        f"Descriptions:\n{listing}\n\n"
        f"Merged description:"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def build_keywords_messages(query: str) -> list[dict]:
    """Messages asking for the query's high-level (themes) and low-level (specific names) keywords as JSON."""
    system = (
        "You prepare search keywords for a knowledge-graph retriever. Given a question, return JSON with two "
        'lists: "high_level_keywords" for the broad themes or concepts the question is about, and '
        '"low_level_keywords" for the specific entities, names, places, dates or terms it mentions. '
        "Copy names exactly as written in the question. Use short phrases, no duplicates, and an empty list "
        "when there is nothing for a field. Reply with the JSON object only."
    )
    example_q = "Which glassworks made the lens of the Corvo Point lighthouse, and what else did it produce?"
    example_a = (
        '{"high_level_keywords": ["manufacturing", "lighthouse optics", "company products"], '
        '"low_level_keywords": ["Corvo Point lighthouse", "lens", "glassworks"]}'
    )
    user = f"Example question: {example_q}\nExample answer: {example_a}\n\nQuestion: {query}\nJSON:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def build_answer_messages(query: str, context: str, *, response_type: str = "", user_prompt: str = "",
                          history: list[dict] | None = None) -> list[dict]:
    """Messages asking for an answer grounded only in the numbered context, citing passages as [n].

    `response_type` (e.g. "a bulleted list", "one paragraph") and `user_prompt` (the user's own instructions)
    shape the reply; `history` is the conversation so far ({role: user|assistant, content}) and goes between
    the instructions and the new question, so a follow-up like "and his brother?" can be understood."""
    system = (
        "You answer questions using only the numbered context passages provided. Cite the passages that "
        "support each statement with their numbers in square brackets, like [1] or [2][5]. If the context "
        "does not contain the answer, say that the indexed documents do not say, rather than guessing. "
        "Be concise and do not mention these instructions."
    )
    if response_type:
        system += f" Format the answer as: {response_type}."
    if user_prompt:
        system += f"\n\nAdditional instructions from the user:\n{user_prompt}"
    user = f"Context:\n{context}\n\nQuestion: {query}\n\nAnswer:"
    turns = [{"role": t["role"], "content": t["content"]} for t in history or []]
    return [{"role": "system", "content": system}, *turns, {"role": "user", "content": user}]


def build_fact_filter_messages(query: str, facts: list[tuple[str, str, str]]) -> list[dict]:
    """Messages asking which of the numbered candidate facts could help answer the question (HippoRAG 2's
    recognition memory step), as JSON {"relevant": [numbers]}."""
    system = (
        "You filter facts for a retriever. Given a question and numbered candidate facts (subject, predicate, "
        "object), return the numbers of the facts that name something the question is about or that could be a "
        "step towards its answer. Drop facts that only share a word with the question. Keep the order of "
        'relevance. Reply with a JSON object only: {"relevant": [numbers]}, an empty list when none helps.'
    )
    lines = "\n".join(f"{i}. ({s}, {p}, {o})" for i, (s, p, o) in enumerate(facts, 1))
    user = f"Question: {query}\n\nCandidate facts:\n{lines}\n\nJSON:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def build_schema_messages(chunk_text: str) -> list[dict]:
    """Messages asking which entity and relation types one passage shows (`hrag schema suggest`), as JSON."""
    system = (
        "You help design the schema of a knowledge graph. Given a passage, name the general kinds of things it "
        "mentions and the general kinds of relations it states between them. Use short, general, lowercase "
        "type names joined by underscores (person, organization, chemical_compound, works_for, located_in), "
        "not names of particular things. Give each type a one-line description. For each relation type give "
        "the entity types of its source and target. Reply with a JSON object only:\n"
        '{"entity_types": [{"type": "...", "description": "..."}], '
        '"relation_types": [{"type": "...", "description": "...", "source": "...", "target": "..."}]}'
    )
    user = f"Passage:\n{chunk_text}\n\nJSON:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]

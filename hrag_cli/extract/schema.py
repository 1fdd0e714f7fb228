"""The graph schema file (`--schema FILE`, `[extract] schema`): the entity and relation types a user wants, read
from TOML or JSON, checked with one-line errors, and the one place that maps a model's type onto a schema type.

    [entities.person]
    description = "A human being."
    synonyms = ["people", "individual"]          # optional: other names the model may use for this type
    [relations.works_for]
    description = "A person is employed by or leads an organization."
    patterns = [["person", "organization"]]      # optional: the (source type, target type) pairs it may join
    properties = ["since"]                       # optional, on entities and relations: described, not enforced

Type names are stored as the parser stores types (parser.clean_type: lowercase, words joined by `_`).
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from hrag_cli.core.config import ExtractSettings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import fingerprint
from hrag_cli.extract.parser import clean_type, type_forms

_TYPE_KEYS = {"description", "synonyms", "properties"}
_RELATION_KEYS = _TYPE_KEYS | {"patterns"}
FIX = "see the README's 'Schema file' section"


@dataclass(frozen=True)
class SchemaType:
    name: str
    description: str
    synonyms: tuple[str, ...] = ()
    properties: tuple[str, ...] = ()
    patterns: tuple[tuple[str, str], ...] = ()   # relations only; empty: any two schema entity types


@dataclass(frozen=True)
class Schema:
    path: str
    entities: tuple[SchemaType, ...]
    relations: tuple[SchemaType, ...]
    fingerprint: str
    # what a model's type maps to, memoised: prune asks once per row, and models repeat a few types
    _seen: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def entity_names(self) -> list[str]:
        return [t.name for t in self.entities]

    def entity_type(self, model_type: str) -> str | None:
        """The schema entity type `model_type` stands for (by name or synonym, singular or plural), or None."""
        t = self._find("e", model_type, self.entities)
        return t.name if t else None

    def relation_type(self, model_type: str) -> SchemaType | None:
        return self._find("r", model_type, self.relations)

    def _find(self, kind: str, model_type: str, types: tuple[SchemaType, ...]) -> SchemaType | None:
        key = (kind, model_type)
        if key not in self._seen:
            self._seen[key] = _lookup(_index(types), model_type)
        return self._seen[key]


def _index(types: tuple[SchemaType, ...]) -> dict[str, SchemaType]:
    """Every accepted spelling (name and synonyms, normalised, with their singulars) -> the schema type."""
    out: dict[str, SchemaType] = {}
    for t in types:
        for word in (t.name, *t.synonyms):
            key = clean_type(word)
            for form in (key, *type_forms(key)):
                out.setdefault(form, t)
    return out


def _lookup(index: dict[str, SchemaType], model_type: str) -> SchemaType | None:
    key = clean_type(model_type or "")
    return next((index[form] for form in (key, *type_forms(key)) if form in index), None)


# ----------------------------------------------------------------------------------------------- reading


def schema_of(extract_settings: ExtractSettings) -> Schema | None:
    """The schema `[extract] schema` / `--schema` names, or None when none is set."""
    path = (extract_settings.schema or "").strip()
    return load_schema(path) if path else None


def load_schema(path: str | os.PathLike) -> Schema:
    """Read and check a schema file; a UsageError (exit 2) names the file, the key, what is wrong and the fix."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError:
        raise UsageError(f"schema file {p}: not found; give the path of a TOML or JSON schema ({FIX})") from None
    return _load(str(p.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _load(path: str, _mtime_ns: int, _size: int) -> Schema:
    """Cached per file version: every chunk's extraction asks for the schema."""
    try:
        raw = Path(path).read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"schema file {path}: cannot be read as UTF-8 text ({exc})") from None
    if path.lower().endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"schema file {path}: not valid JSON ({exc}); fix the syntax or use TOML") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"schema file {path}: not valid TOML ({exc}); fix the syntax ({FIX})") from None
    if not isinstance(data, dict):
        raise UsageError(f"schema file {path}: the top level must be a table with [entities.*] and [relations.*]")
    unknown = sorted(set(data) - {"entities", "relations"})
    if unknown:
        raise UsageError(f"schema file {path}: unknown key '{unknown[0]}'; a schema has only 'entities' and "
                         f"'relations' ({FIX})")
    entities = _types(path, data, "entities", _TYPE_KEYS)
    if not entities:
        raise UsageError(f"schema file {path}: no entity types; add at least one [entities.NAME] with a "
                         f"description ({FIX})")
    relations = _types(path, data, "relations", _RELATION_KEYS)
    names = {t.name for t in entities}
    for rel in relations:
        for src, tgt in rel.patterns:
            for end in (src, tgt):
                if end not in names:
                    raise UsageError(f"schema file {path}: relations.{rel.name}.patterns names '{end}', which is "
                                     f"not an entity type; use one of {', '.join(sorted(names))}")
    fp = fingerprint([_plain(t) for t in entities], [_plain(t) for t in relations])
    return Schema(path=path, entities=entities, relations=relations, fingerprint=fp)


def _plain(t: SchemaType) -> list:
    return [t.name, t.description, list(t.synonyms), list(t.properties), [list(p) for p in t.patterns]]


def _types(path: str, data: dict, section: str, allowed: set[str]) -> tuple[SchemaType, ...]:
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise UsageError(f"schema file {path}: '{section}' must be a table of types, e.g. [{section}.NAME] ({FIX})")
    out: list[SchemaType] = []
    seen: dict[str, str] = {}
    for raw_name, body in table.items():
        where = f"{section}.{raw_name}"
        name = clean_type(str(raw_name))
        if name in seen:
            raise UsageError(f"schema file {path}: {where} is the same type as {section}.{seen[name]}; "
                             "give each type once")
        seen[name] = str(raw_name)
        if not isinstance(body, dict):
            raise UsageError(f"schema file {path}: {where} must be a table with a description ({FIX})")
        extra = sorted(set(body) - allowed)
        if extra:
            raise UsageError(f"schema file {path}: {where}.{extra[0]} is not a schema key; use "
                             f"{', '.join(sorted(allowed))}")
        desc = body.get("description")
        if not isinstance(desc, str) or not desc.strip():
            raise UsageError(f"schema file {path}: {where}.description is missing or empty; add "
                             f'description = "one line saying what a {raw_name} is"')
        if not isinstance(body.get("patterns", []), list):
            raise UsageError(f"schema file {path}: {where}.patterns must be a list of pairs, "
                             'e.g. [["person", "organization"]]')
        patterns: list[tuple[str, str]] = []
        for i, pat in enumerate(body.get("patterns", [])):
            if not (isinstance(pat, list) and len(pat) == 2 and all(isinstance(x, str) and x.strip() for x in pat)):
                raise UsageError(f"schema file {path}: {where}.patterns[{i}] must be a pair "
                                 f'["source type", "target type"], not {pat!r}')
            patterns.append((clean_type(pat[0]), clean_type(pat[1])))
        out.append(SchemaType(name=name, description=" ".join(desc.split()),
                              synonyms=_strings(path, where, body, "synonyms"),
                              properties=_strings(path, where, body, "properties"), patterns=tuple(patterns)))
    return tuple(out)


def _strings(path: str, where: str, body: dict, key: str) -> tuple[str, ...]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UsageError(f"schema file {path}: {where}.{key} must be a list of non-empty strings, "
                         f'e.g. {key} = ["a", "b"]')
    return tuple(v.strip() for v in value)

"""What resolve keeps per merged key, and the record each key becomes.

The accumulators are filled by resolve's merge (and saved between runs by resolve/state.py); the record makers
turn one accumulator into its entity, relation or fact. Both a full resolve and the patch after additions
(resolve/patch.py) make records here, so the two paths cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hrag_cli.core.project import fingerprint
from hrag_cli.core.records import Entity, Fact, Relation

UNKNOWN = "UNKNOWN"
_PLACEHOLDER_TYPES = {"", "unknown"}


class _Saved:
    """A saved state holds each accumulator as the tuple (key, *slots) (resolve/state.py), and a loaded state
    keeps the keys no new record touches as those tuples: making millions of objects cost more than the rest
    of the load. `saved` makes the object when a key is touched; `item` is the tuple again."""

    __slots__ = ()

    @classmethod
    def saved(cls, item: tuple) -> Any:
        acc = cls.__new__(cls)
        for name, value in zip(cls.__slots__, item[1:], strict=True):
            setattr(acc, name, value)
        return acc

    def fields(self) -> tuple:
        """The fields as resolve_state saves them, in slot order."""
        return tuple(getattr(self, name) for name in self.__slots__)

    def item(self, key: Any) -> tuple:
        return (key, *self.fields())


def live(accs: dict, key: Any, cls: type) -> Any:
    """The accumulator of `key` in `accs`, made from its saved tuple (and put back) when it is one."""
    acc = accs[key]
    if acc.__class__ is tuple:
        acc = accs[key] = cls.saved(acc)
    return acc


class _EntityAcc(_Saved):
    __slots__ = ("names", "types", "descs", "sources", "aliases")

    def __init__(self) -> None:
        self.names: dict[str, int] = {}     # surface form -> mentions
        self.types: dict[str, int] = {}     # type -> entity rows
        self.descs: dict[str, int] = {}     # description -> entity rows
        self.sources: list[str] = []        # chunk ids, ascending (resolve._insert_source)
        self.aliases: set[str] | None = None   # aliases the rows declared (surface forms)


class _RelationAcc(_Saved):
    __slots__ = ("weight", "predicates", "keywords", "descs", "sources", "types")

    def __init__(self) -> None:
        self.weight = 0.0
        self.predicates: list[str] = []     # distinct; lists, not sets: a third of the memory, and short
        self.keywords: list[str] = []
        self.descs: dict[str, int] = {}
        self.sources: list[str] = []
        self.types: dict[str, int] | None = None   # schema relation type -> mentions (None: no typed mention)


class _FactAcc(_Saved):
    __slots__ = ("predicates", "sources")

    def __init__(self) -> None:
        self.predicates: dict[str, int] = {}
        self.sources: list[str] = []


def _top(counts: dict[str, int]) -> str:
    """Most frequent, ties broken by the smallest text."""
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def _vote_type(types: dict[str, int]) -> str:
    real = {t: c for t, c in types.items() if t.casefold() not in _PLACEHOLDER_TYPES}
    return _top(real) if real else UNKNOWN


def _aliases(name: str, names: dict[str, int], declared: set[str] | None) -> list[str]:
    """Every other surface form the entity was mentioned by (`names`), then the `declared` aliases not among
    them (case-insensitively), sorted."""
    out = [n for n in names if n != name]
    if declared:
        seen = {n.casefold() for n in names}
        out += [a for a in declared if a and a.casefold() not in seen]
    return sorted(out)


def _union(values: list[str]) -> list[str]:
    """Case-insensitive union (the smallest spelling of each wins), sorted case-insensitively."""
    best: dict[str, str] = {}
    for v in values:
        k = v.casefold()
        if k not in best or v < best[k]:
            best[k] = v
    return [best[k] for k in sorted(best)]


def entity_record(eid: str, acc: _EntityAcc, name: str, description: str) -> Entity:
    return Entity(id=eid, name=name, type=_vote_type(acc.types), description=description,
                  aliases=_aliases(name, acc.names, acc.aliases), source_ids=acc.sources)


def relation_record(pair: tuple[str, str], racc: _RelationAcc, description: str) -> Relation:
    return Relation(id=relation_id(pair), src=pair[0], tgt=pair[1], predicates=_union(racc.predicates),
                    keywords=_union(racc.keywords), description=description, weight=racc.weight,
                    source_ids=racc.sources, rel_type=relation_type(racc.types))


def relation_id(pair: tuple[str, str]) -> str:
    return fingerprint("relation", pair[0], pair[1])


def relation_type(types: dict[str, int] | None) -> str:
    """The most frequent schema relation type of a relation's typed mentions ("" without any)."""
    return _top(types) if types else ""


def fact_record(fkey: tuple[str, str, str], facc: _FactAcc, subject: str, obj: str, relation_id: str) -> Fact:
    return Fact(id=fingerprint("fact", *fkey), subject=subject, predicate=_top(facc.predicates), object=obj,
                relation_id=relation_id, source_ids=facc.sources)


def relation_ends(r: Any, ident: Callable[[Any], tuple[str, str]], row_ids: dict[str, str],
                  entity_id: Callable[[str], str]) -> tuple[str, str, str, str] | None:
    """A relation row's endpoints as (source id, its surface form, target id, its surface form), None when an end
    names nothing; an end written as a name or alias of an entity row of the same chunk is that entity. One rule
    for the in-memory merge and the partitioned one, so both give the same graph."""
    s, s_sf = ident(r.src)
    t, t_sf = ident(r.tgt)
    if not s or not t:
        return None
    return row_ids.get(s) or entity_id(s), s_sf, row_ids.get(t) or entity_id(t), t_sf

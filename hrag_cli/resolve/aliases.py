"""Which extracted names are one entity: the merge keys resolve uses.

An entity mention is keyed by its normalised name (normalize.normalize_name) and its type. The rule:

- Same key, same type: one entity (as before).
- Same key, different real types from the LLM extractor: different entities ("Jordan" the person and "Jordan"
  the country). The type with the most entity rows keeps the plain key as its id; each other gets
  "key (type)". Only a model's types split: it chose them from the configured list and read the sentence; the
  rules extractor guesses types from the name alone ("Charlemagne" is a person in one chunk, a location in
  the next), so its rows (and the OpenIE import's, which have none) split nothing and its graph is the one it
  always was.
- Placeholder types ("", "unknown", "other": the model did not know, or used a type outside the list) and
  relation endpoints with no entity row in their chunk split nothing: they join the key's most frequent real
  type.
- Aliases: an entity row's aliases link its key to each alias key of the same type (or to an alias key that
  has only placeholder types). Linked keys are joined by union-find, which never joins two groups of
  different real types, so a chain of aliases cannot pull a person into a city. A group's id is the key with
  the most entity rows (ties: the smallest). An alias that is never a name in its own right still reaches
  the entity (its aliases), and a relation endpoint written with it joins the entity when only one group
  claims it.

`plan_merges` reads every record once (as they stream, in chunk_id order) and returns `MergeKeys`; resolve asks it for the id of each mention.
`MergeKeys.merges` records which keys were joined through which alias pairs (graph/merges.jsonl).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from hrag_cli.core import store
from hrag_cli.core.normalize import normalize_name
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import ExtractionRecord

PLACEHOLDER_TYPES = frozenset({"", "unknown", "other"})
TYPED_EXTRACTORS = ("llm:",)     # extractor fingerprints whose types split a name (see above)

Node = tuple[str, str]           # (name key, real type or "")


def type_class(t: object) -> str:
    """A type as the merge rule sees it: casefolded; "" for a placeholder."""
    c = t.strip().casefold() if isinstance(t, str) else ""
    return "" if c in PLACEHOLDER_TYPES else c


@dataclass
class Merge:
    """One entity built from several name keys."""

    id: str
    keys: list[str]                              # name keys joined into it
    type: str = ""
    via: list[list[str]] = field(default_factory=list)   # [name key, alias key] links that joined them


@dataclass
class Split:
    """One key whose rows came with several real types: one entity per type."""

    key: str
    ids: list[str]
    types: list[str]


@dataclass
class MergeKeys:
    """The entity id of each (name key, type) mention; identity when nothing merges or splits."""

    # nodes whose id is not their key, and every node of a key split by type
    node_ids: dict[Node, str] = field(default_factory=dict)
    dominant: dict[str, str] = field(default_factory=dict)      # key -> its most frequent real type
    alias_only: dict[str, str] = field(default_factory=dict)    # alias key never a name -> entity id
    merges: list[Merge] = field(default_factory=list)
    splits: list[Split] = field(default_factory=list)
    refused: int = 0                              # alias links not followed: the types differ

    def entity_id(self, key: str, etype: str = "") -> str:
        """Id of a mention of `key` whose row has type `etype` ("" for an endpoint without a row)."""
        if not self.node_ids and not self.alias_only:
            return key
        main, t = self.dominant.get(key, ""), type_class(etype)
        got = self.node_ids.get((key, t or main))
        if got is None and t:
            got = self.node_ids.get((key, main))    # a type from a record whose types split nothing
        if got is not None:
            return got
        if key not in self.dominant:
            return self.alias_only.get(key, key)
        return key

    def report(self) -> list[dict]:
        """graph/merges.jsonl: one line per entity joined from several keys, one per key split by type."""
        return ([{"merged": m.id, "type": m.type, "keys": m.keys, "via": m.via} for m in self.merges]
                + [{"split": s.key, "ids": s.ids, "types": s.types} for s in self.splits])

    def stats(self) -> dict:
        return {"alias_merges": len(self.merges), "alias_keys_merged": sum(len(m.keys) for m in self.merges),
                "alias_links_refused": self.refused, "type_splits": len(self.splits)}


class _UnionFind:
    """Union-find over nodes; each set carries its real type ("" while it has none) and refuses a union of
    two different real types."""

    def __init__(self) -> None:
        self.parent: dict[Node, Node] = {}
        self.kind: dict[Node, str] = {}

    def add(self, n: Node) -> None:
        if n not in self.parent:
            self.parent[n] = n
            self.kind[n] = n[1]

    def find(self, n: Node) -> Node:
        root = n
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[n] != root:
            self.parent[n], n = root, self.parent[n]
        return root

    def union(self, a: Node, b: Node) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        ka, kb = self.kind[ra], self.kind[rb]
        if ka and kb and ka != kb:
            return False
        if rb < ra:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.kind[ra] = ka or kb
        return True


def needs_plan(rec: ExtractionRecord) -> bool:
    """Whether a record can make two names one entity or one name two: a model's typed rows, or aliases."""
    return rec.extractor.startswith(TYPED_EXTRACTORS) or any(e.aliases for e in rec.entities)


def plan_merges(records: Iterable[ExtractionRecord]) -> MergeKeys:
    """The merge keys of every entity row of `records` (read once, one at a time, in chunk_id order; rows only,
    no relations); none at all for records of extractors whose types split nothing and that give no aliases:
    every offline build."""
    rows: dict[str, dict[str, int]] = {}          # key -> real type ("" placeholder) -> entity rows
    links: list[tuple[str, str, str]] = []        # (key, type class, alias key)
    needed = False
    for rec in records:
        typed = rec.extractor.startswith(TYPED_EXTRACTORS)
        needed = needed or needs_plan(rec)
        for e in rec.entities:
            key = normalize_name(e.name) if isinstance(e.name, str) else ""
            if not key:
                continue
            t = type_class(e.type) if typed else ""
            per = rows.get(key)
            if per is None:
                per = rows[key] = {}
            per[t] = per.get(t, 0) + 1
            for a in e.aliases or ():
                ak = normalize_name(a) if isinstance(a, str) else ""
                if ak and ak != key:
                    links.append((key, t, ak))
    if not needed:
        return MergeKeys()
    out = MergeKeys()
    for key, per in rows.items():
        real = [(n, t) for t, n in per.items() if t]
        out.dominant[key] = min(real, key=lambda nt: (-nt[0], nt[1]))[1] if real else ""
    split_keys = {k for k, per in rows.items() if sum(1 for t in per if t) > 1}
    if not links and not split_keys:
        out.dominant.clear()      # every id is its key: entity_id answers without it
        return out

    uf = _UnionFind()
    weight: dict[Node, int] = {}                  # node -> entity rows
    for key, per in rows.items():
        for t, c in per.items():
            n = (key, t or out.dominant[key])
            uf.add(n)
            weight[n] = weight.get(n, 0) + c
    via: dict[Node, list[list[str]]] = {}
    claims: dict[str, set[Node]] = {}
    for key, t, ak in links:
        a = (key, t or out.dominant[key])
        if ak not in rows:
            claims.setdefault(ak, set()).add(a)
            continue
        if not a[1] or not out.dominant[ak]:
            b = (ak, out.dominant[ak])          # a placeholder side takes the other's (main) type
        elif a[1] in rows[ak]:
            b = (ak, a[1])
        else:
            out.refused += 1        # the alias key names only things of other real types
            continue
        if uf.union(a, b):
            via.setdefault(a, []).append([key, ak])
        else:
            out.refused += 1

    groups: dict[Node, list[Node]] = {}
    for n in uf.parent:
        groups.setdefault(uf.find(n), []).append(n)
    # the group's id: its heaviest key; when two groups want one key, the heavier keeps it plain
    best: dict[Node, tuple[int, str]] = {}
    for root, members in groups.items():
        keyw: dict[str, int] = {}
        for n in members:
            keyw[n[0]] = keyw.get(n[0], 0) + weight[n]
        best[root] = min(((-w, k) for k, w in keyw.items()))
    by_key: dict[str, list[Node]] = {}
    for root, (_, k) in best.items():
        by_key.setdefault(k, []).append(root)
    taken = set(rows)
    for k, roots in sorted(by_key.items()):
        roots.sort(key=lambda r: (best[r][0], uf.kind[r]))
        ids = [k]
        for r in roots[1:]:
            cand, i = f"{k} ({uf.kind[r] or 'unknown'})", 2
            while cand in taken:
                cand, i = f"{k} ({uf.kind[r] or 'unknown'} {i})", i + 1
            taken.add(cand)
            ids.append(cand)
        for r, eid in zip(roots, ids):
            members = sorted(groups[r])
            for n in members:
                if eid != n[0] or n[0] in split_keys:
                    out.node_ids[n] = eid
            keys = sorted({n[0] for n in members})
            if len(keys) > 1:
                out.merges.append(Merge(eid, keys, uf.kind[r], sorted(l for n in members for l in via.get(n, []))))
        if len(roots) > 1:
            out.splits.append(Split(k, ids, [uf.kind[r] for r in roots]))
    for ak, claimants in sorted(claims.items()):
        ids = {out.node_ids.get(n, n[0]) for n in claimants}
        if len(ids) == 1:
            out.alias_only[ak] = ids.pop()
    return out


STATUS_LINES = 10


def merges_status(project: ProjectDir) -> dict:
    """The first lines of graph/merges.jsonl as `hrag status` shows them ("ibm <- ibm + international business
    machines"; "jordan: split into jordan / jordan (person)"); nothing when no name was joined or split."""
    lines = []
    for m in islice(store.read_jsonl(project.merges_path), STATUS_LINES):
        if isinstance(m, dict) and "merged" in m:
            lines.append(f"{m['merged']} <- {' + '.join(m.get('keys', []))}")
        elif isinstance(m, dict) and "split" in m:
            lines.append(f"{m['split']}: split into {' / '.join(m.get('ids', []))}")
    return {"merged_names": lines} if lines else {}

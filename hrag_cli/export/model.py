"""The neutral export model every writer takes (GraphML, JSONL, CSV, Cypher, FalkorDB): nodes and edges with
clean, typed properties. Its own module so the writers depend on it, not on export.py, which depends on them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

LABELS = {"document": "Document", "chunk": "Chunk", "entity": "Entity"}
ID_PREFIX = {"document": "doc:", "chunk": "chunk:", "entity": "entity:"}
EDGE_TYPES = ("PART_OF", "NEXT_CHUNK", "RELATION", "MENTIONED_IN", "SYNONYM")


@dataclass
class Node:
    id: str
    label: str                      # Document, Chunk or Entity
    props: dict[str, Any]           # plain JSON-able values; lists are lists of str; None never stored


@dataclass
class Edge:
    source: str
    target: str
    type: str
    props: dict[str, Any]


@dataclass
class ExportGraph:
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        by_label: dict[str, int] = {}
        for n in self.nodes:
            by_label[n.label] = by_label.get(n.label, 0) + 1
        by_type: dict[str, int] = {}
        for e in self.edges:
            by_type[e.type] = by_type.get(e.type, 0) + 1
        return {"nodes": len(self.nodes), "edges": len(self.edges), "labels": by_label, "types": by_type}


# -- value normalisation ----------------------------------------------------------------------------------
def clean_value(value: Any) -> Any:
    """One representation per value for every writer: numpy scalars become Python numbers, lists become lists
    of strings, maps become JSON strings, None/NaN mean "no property"."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:   # the common cases first: this runs per value
        return value
    if t is float:
        return value if math.isfinite(value) else None
    if t is list and all(type(v) is str for v in value):
        return value
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        return clean_value(value.item())            # numpy scalar
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return clean_value(float(value))
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
        return [v if type(v) is str else orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY).decode()
                for v in items if v is not None]
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS).decode()


def property_types(items: list[Node] | list[Edge]) -> dict[str, str]:
    """Property name -> string | int | float | boolean | string[], in order of first appearance; an int
    property that is a float elsewhere becomes float, anything else mixed becomes string."""
    types: dict[str, str] = {}
    for item in items:
        for k, v in item.props.items():
            t = ("boolean" if isinstance(v, bool) else "int" if isinstance(v, int) else
                 "float" if isinstance(v, float) else "string[]" if isinstance(v, list) else "string")
            old = types.get(k)
            if old is None or old == t:
                types[k] = t
            elif {old, t} == {"int", "float"}:
                types[k] = "float"
            else:
                types[k] = "string"
    return types

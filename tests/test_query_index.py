"""Query-side loading: facts read on demand by row, with a fallback when the file no longer matches the index."""

from __future__ import annotations

import numpy as np

from hrag_cli import store
from hrag_cli.config import VectorSettings
from hrag_cli.query.index import RowRecords
from hrag_cli.records import Fact, to_dict
from hrag_cli.vectors import VectorIndex


def test_facts_are_read_by_row_and_fall_back_when_the_file_moved(tmp_path) -> None:
    facts = [Fact(f"f{i}", f"S{i}", "founded", f"O{i}", f"r{i}", ["c1"]) for i in range(50)]
    path = tmp_path / "facts.jsonl"
    store.write_jsonl(path, (to_dict(f) for f in facts))
    m = np.eye(64, dtype=np.float32)[:50]
    idx = VectorIndex.build("facts", [f.id for f in facts], m, VectorSettings(), "m")
    table = RowRecords(path, Fact, lambda: idx)
    assert table["f17"] == facts[17] and table.get("f3") == facts[3] and "f49" in table
    assert table._all is None                       # nothing but the two lines was parsed
    assert table.get("nope") is None and "nope" not in table
    store.write_jsonl(path, (to_dict(f) for f in reversed(facts)))        # rewritten in another order
    moved = RowRecords(path, Fact, lambda: idx)
    assert moved["f17"] == facts[17] and moved._all is not None and len(moved) == 50

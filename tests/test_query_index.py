"""Query-side loading: facts and entities read on demand by row, with a fallback when the file no longer matches
the index."""

from __future__ import annotations

import numpy as np

from hrag_cli.core import store
from hrag_cli.core.config import VectorSettings
from hrag_cli.query.index import RowRecords
from hrag_cli.core.records import Document, Fact, to_dict
from hrag_cli.storage.vectors.index import VectorIndex


def test_facts_are_read_by_row_and_fall_back_when_the_file_moved(tmp_path) -> None:
    facts = [Fact(f"f{i}", f"S{i}", "founded", f"O{i}", f"r{i}", ["c1"]) for i in range(50)]
    path = tmp_path / "facts.jsonl"
    store.write_jsonl(path, (to_dict(f) for f in facts))
    m = np.eye(64, dtype=np.float32)[:50]
    idx = VectorIndex.build("facts", [f.id for f in facts], m, VectorSettings(), "m")
    table = RowRecords(path, Fact, idx.position)
    assert table["f17"] == facts[17] and table.get("f3") == facts[3] and "f49" in table
    assert table._all is None                       # nothing but the two lines was parsed
    assert table.get("nope") is None and "nope" not in table
    store.write_jsonl(path, (to_dict(f) for f in reversed(facts)))        # rewritten in another order
    moved = RowRecords(path, Fact, idx.position)
    assert moved["f17"] == facts[17] and moved._all is not None and len(moved) == 50


def test_complete_positions_answer_membership_without_reading(tmp_path) -> None:
    """Entities: the graph knows every id, so a name that is no entity is absent without the file being read,
    and a compressed file is read at its lines too."""
    facts = [Fact(f"f{i}", f"S{i}", "founded", f"O{i}", f"r{i}", ["c1"]) for i in range(20)]
    path = tmp_path / "facts.jsonl"
    store.write_jsonl(path, (to_dict(f) for f in facts), compress=True)
    rows = {f.id: i for i, f in enumerate(facts)}
    table = RowRecords(path, Fact, rows.get, complete=True)
    assert "nope" not in table and table.get("nope") is None and table._lines is None   # nothing read
    assert "f4" in table and table._lines is None
    assert table["f19"] == facts[19] and table.get("f0") == facts[0] and table._all is None
    rows["f5"] = 6                                  # a line that is not the record asked for: the whole file
    assert table["f5"] == facts[5] and table._all is not None


def test_doc_paths_are_read_at_their_lines_else_whole(tmp_path) -> None:
    """A document's path comes from its own line of docs.jsonl, found by the id its line opens with (a text that
    quotes another document's id is not taken for it, nor is an id sharing the first 8 bytes); an absent id, an
    id shorter than 8 bytes or a file whose lines open otherwise reads the file whole."""
    from hrag_cli.query.index import DocPaths
    from hrag_cli.core.project import text_hash

    ids = [text_hash(f"p/{i}.txt") for i in range(10)]
    ids[5] = ids[6][:8] + "x" * 24                  # the same first 8 bytes as another id
    docs = [Document(doc_id=ids[i], path=f"p/{i}.txt", sha256="", bytes=1, n_chunks=1,
                     metadata={"note": {"doc_id": ids[7]} if i == 3 else ""}) for i in range(10)]
    path = tmp_path / "docs.jsonl"
    store.write_jsonl(path, (to_dict(d) for d in docs))
    reads = []

    def whole():
        reads.append(1)
        return {d.doc_id: d.path for d in docs}

    paths = DocPaths(path, whole)
    assert [paths.get(ids[i]) for i in (7, 3, 0, 6, 5, 9)] == [f"p/{i}.txt" for i in (7, 3, 0, 6, 5, 9)]
    assert not reads
    for block in (64, 173, 4096):                   # lines and their ids across the blocks the file is read in
        small = DocPaths(path, whole)
        small._BLOCK = block
        assert [small.get(d) for d in ids] == [f"p/{i}.txt" for i in range(10)] and not reads
    assert paths.get("absent" * 4) == "" and paths.get("d7") == "" and len(reads) == 2
    store.write_jsonl(path, ({"path": d.path, "doc_id": d.doc_id} for d in docs))    # another field order
    assert DocPaths(path, whole).get(ids[4]) == "p/4.txt" and len(reads) == 3


def test_doc_paths_leave_no_file_open(tmp_path, monkeypatch) -> None:
    """The lines' pass and each lookup close docs.jsonl, also when a read fails (then the file is read whole):
    a dropped DocPaths warns of no unclosed file."""
    import gc
    import os
    import warnings

    from hrag_cli.core.project import text_hash
    from hrag_cli.query.index import DocPaths

    ids = [text_hash(f"p/{i}.txt") for i in range(3)]
    path = tmp_path / "docs.jsonl"
    store.write_jsonl(path, ({"doc_id": d, "path": f"p/{i}.txt"} for i, d in enumerate(ids)))
    gc.collect()        # files other tests left to the collector warn before this test looks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = DocPaths(path, lambda: {})
        assert paths.get(ids[1]) == "p/1.txt" and paths._lines is not None
        broken = DocPaths(path, lambda: {ids[2]: "whole"})

        def pread(*_):
            raise OSError("read failed")

        monkeypatch.setattr(os, "pread", pread)
        assert broken.get(ids[2]) == "whole" and broken._lines is None
        monkeypatch.undo()
        del paths, broken
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning) and str(path) in str(w.message)]

"""VectorIndex: exact and HNSW search agree, incremental sync, atomic save/load round trip."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from hrag_cli.core import store
from hrag_cli.core.config import VectorSettings
from hrag_cli.core.errors import HragError
from hrag_cli.storage.vectors.dense import exact_topk
from hrag_cli.storage.vectors.files import ReadAt
from hrag_cli.storage.vectors.index import FORMAT, VectorIndex
from hrag_cli.storage.vectors.search import top_order
from hrag_cli.storage.vectors.sparse import sparse_rows


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    m = rng.standard_normal((n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def ids_of(n: int, prefix: str = "x") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


@pytest.mark.parametrize("exact_below", [0, 10_000])
def test_search_finds_itself_and_matches_brute_force(exact_below: int) -> None:
    rng = np.random.default_rng(0)
    m = unit(rng, 300, 32)
    idx = VectorIndex.build("t", ids_of(300), m, VectorSettings(exact_below=exact_below), "model-a")
    ids, sims = idx.search(m[:20], 5)
    assert [row[0] for row in ids] == ids_of(20)
    assert np.allclose(sims[:, 0], 1.0, atol=2e-3)
    rows, exact = exact_topk(m, m[:20], 5)
    assert np.allclose(sims, exact, atol=2e-3)
    assert [[f"x{r}" for r in row] for row in rows.tolist()] == ids
    # 1-D query and k beyond the size
    one_ids, one_sims = idx.search(m[3], 1000)
    assert len(one_ids) == 1 and len(one_ids[0]) == 300 and one_sims.shape == (1, 1000)
    assert np.isneginf(one_sims[0, 300:]).all()


def test_save_load_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(1)
    m = unit(rng, 50, 16)
    s = VectorSettings(exact_below=0)
    idx = VectorIndex.build("entities", ids_of(50), m, s, "model-a", hashes=[f"h{i}" for i in range(50)])
    idx.save(tmp_path)
    assert (tmp_path / "entities.hnsw").exists() and (tmp_path / "entities.ids.jsonl").exists()
    back = VectorIndex.load(tmp_path, "entities", s)
    assert back is not None and back.model_id == "model-a" and back.dim == 16 and len(back) == 50
    assert back.ids == idx.ids and back.hashes == idx.hashes
    assert np.allclose(back.vectors(), m, atol=2e-3)
    assert back.search(m[7], 1)[0] == [["x7"]]
    assert VectorIndex.load(tmp_path, "missing", s) is None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_damaged_pair_is_reported(tmp_path) -> None:
    rng = np.random.default_rng(2)
    s = VectorSettings(exact_below=0)
    VectorIndex.build("chunks", ids_of(10), unit(rng, 10, 8), s, "m").save(tmp_path)
    (tmp_path / "chunks.hnsw").write_bytes(b"garbage")
    with pytest.raises(HragError, match="hrag synonyms"):
        VectorIndex.load(tmp_path, "chunks", s)
    VectorIndex.build("chunks", ids_of(10), unit(rng, 10, 8), s, "m").save(tmp_path)
    VectorIndex.matrix_path(tmp_path, "chunks").write_bytes(b"garbage")
    with pytest.raises(HragError, match="hrag synonyms"):
        VectorIndex.load(tmp_path, "chunks", s)
    # load_or_create treats a damaged or foreign index as absent
    fresh = VectorIndex.load_or_create(tmp_path, "chunks", s, "m", 8)
    assert len(fresh) == 0


def test_sync_is_incremental_and_exact_about_membership(tmp_path) -> None:
    rng = np.random.default_rng(3)
    s = VectorSettings(exact_below=0)
    m = unit(rng, 200, 16)
    ids, hashes = ids_of(200), [f"h{i}" for i in range(200)]
    idx = VectorIndex.create("e", 16, s, "m")
    assert idx.sync(ids, hashes, m)["rebuilt"] == 1
    # 10 new items, 5 removed, 3 changed (same id, new text): incremental
    extra = unit(rng, 10, 16)
    changed = unit(rng, 3, 16)
    ids2 = ids[5:] + ids_of(10, "new")
    hashes2 = hashes[5:] + [f"n{i}" for i in range(10)]
    m2 = np.concatenate([m[5:], extra])
    for j, p in enumerate((0, 1, 2)):
        hashes2[p] = f"changed{j}"
        m2[p] = changed[j]
    counts = idx.sync(ids2, hashes2, m2)
    assert counts == {"added": 13, "removed": 8, "kept": 192, "rebuilt": 0}
    assert sorted(idx.ids) == sorted(ids2) and len(idx) == 205
    got, sims = idx.search(m2, 1)
    assert [g[0] for g in got] == ids2  # every live vector finds itself; removed ones are gone
    assert np.allclose(sims[:, 0], 1.0, atol=2e-3)
    # survives a save/load and a further sync; tombstoned slots are reused (no growth)
    idx.save(tmp_path)
    back = VectorIndex.load(tmp_path, "e", s)
    assert back is not None
    assert back.sync(ids2, hashes2, m2) == {"added": 0, "removed": 0, "kept": 205, "rebuilt": 0}
    order = [back.position(i) for i in ids2]
    assert np.allclose(back.vectors()[order], m2, atol=2e-3)
    # removing most items triggers a rebuild instead of a tombstone-riddled graph
    counts = back.sync(ids2[:50], hashes2[:50], m2[:50])
    assert counts["rebuilt"] == 1 and len(back) == 50


def test_empty_index(tmp_path) -> None:
    s = VectorSettings()
    idx = VectorIndex.create("facts", 8, s, "m")
    idx.sync([], [], np.zeros((0, 8), np.float32))
    idx.save(tmp_path)
    back = VectorIndex.load(tmp_path, "facts", s)
    assert back is not None and len(back) == 0
    ids, sims = back.search(np.ones(8, np.float32) / np.sqrt(8), 3)
    assert ids == [[]] and sims.shape == (1, 3)


def test_chunk_matrix_is_saved_and_memory_mapped(tmp_path) -> None:
    """Query scores every chunk: the chunks matrix comes back from a .npy map, in id order, after updates."""
    rng = np.random.default_rng(7)
    settings = VectorSettings(exact_below=0)
    m = unit(rng, 50, 16)
    idx = VectorIndex.build("chunks", ids_of(50), m, settings, "model-a", hashes=[str(i) for i in range(50)])
    extra = unit(rng, 5, 16)
    idx.sync(ids_of(45) + ids_of(5, "y"), [str(i) for i in range(45)] + ["y"] * 5, np.vstack([m[:45], extra]))
    idx.save(tmp_path)
    back = VectorIndex.load(tmp_path, "chunks", settings)
    assert isinstance(back.vectors().base, np.memmap)          # a plain array over the mapping
    assert back.ids == ids_of(45) + ids_of(5, "y")
    assert np.allclose(back.vectors(), np.vstack([m[:45], extra]), atol=2e-3)
    # every index keeps its float16 matrix; a small one has no graph file
    VectorIndex.build("facts", ids_of(50), m, VectorSettings(), "model-a").save(tmp_path)
    assert VectorIndex.matrix_path(tmp_path, "facts").exists() and not VectorIndex.paths(tmp_path, "facts")[0].exists()
    assert VectorIndex.load(tmp_path, "facts", VectorSettings()).vectors().dtype == np.float16


def test_sparse_rows_keep_every_column_across_bands(tmp_path) -> None:
    """Columns are stored as a byte within a band of 256 plus per-row band counts: rows touching every band, a
    full band (256 values, past a byte's count) and empty rows come back exactly, through save and load."""
    rng = np.random.default_rng(12)
    n, dim = 60, 2048
    m = np.zeros((n, dim), np.float32)
    for i in range(n):
        cols = rng.choice(dim, size=int(rng.integers(1, 300)), replace=False)
        m[i, cols] = rng.standard_normal(len(cols))
    m[5, 256:512] = 1.0                              # one full band
    m[9, 2047] = 1.0                                  # the last column alone
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    assert sparse_rows(m).bands.max() == 256
    s = VectorSettings()
    VectorIndex.build("facts", ids_of(n), m, s, "m").save(tmp_path)
    back = VectorIndex.load(tmp_path, "facts", s)
    assert back._rows.kind == "sparse" and back._rows.low.dtype == np.uint8
    got = np.asarray(back.vectors(), np.float32)
    assert np.array_equal(got != 0, m != 0) and np.allclose(got, m, atol=1e-3)     # every value in its column
    rows = np.array([9, 5, 0, 59, 5])
    assert np.array_equal(back._rows.dense(rows), got[rows])
    q = rng.standard_normal((3, dim)).astype(np.float32)
    for i in range(3):
        assert np.allclose(back.scores(q[i]), got @ q[i], atol=1e-5)


def _id_map_lines(path) -> list[str]:
    """The id map's lines as text (it is stored gzip-compressed)."""
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def _write_id_map(path, lines: list[str]) -> None:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))


@pytest.mark.parametrize("damage", ["hnsw_same_size", "meta_keys", "labels", "hashes"])
def test_damage_that_passes_the_size_check_is_reported(tmp_path, damage: str) -> None:
    rng = np.random.default_rng(3)
    s = VectorSettings(exact_below=0)
    VectorIndex.build("chunks", ids_of(10), unit(rng, 10, 8), s, "m").save(tmp_path)
    hnsw, ids = VectorIndex.paths(tmp_path, "chunks")
    lines = _id_map_lines(ids)
    if damage == "hnsw_same_size":
        hnsw.write_bytes(b"\0" * hnsw.stat().st_size)
    elif damage == "meta_keys":
        lines[0] = '{"_meta": {"format": 3, "count": 10}}'
    else:                            # the per-row arrays: a label short, hashes of another type
        hashes, labels = VectorIndex.row_paths(tmp_path, "chunks")
        np.save(labels, np.arange(9, dtype=np.int64)) if damage == "labels" else np.save(hashes, np.arange(10))
    if damage == "meta_keys":
        _write_id_map(ids, lines)
    with pytest.raises(HragError, match="hrag synonyms"):
        VectorIndex.load(tmp_path, "chunks", s)
    assert len(VectorIndex.load_or_create(tmp_path, "chunks", s, "m", 8)) == 0   # the stage rebuilds


def test_missing_names_only_new_or_changed_items_and_an_old_format_is_refused(tmp_path) -> None:
    """The index is its own embedding store: a later sync is given vectors for the missing rows only."""
    rng = np.random.default_rng(5)
    s = VectorSettings()
    m = unit(rng, 30, 16)
    ids, hashes = ids_of(30), [f"h{i}" for i in range(30)]
    VectorIndex.build("facts", ids, m, s, "m", hashes=hashes).save(tmp_path)
    idx = VectorIndex.load_or_create(tmp_path, "facts", s, "m", 16)
    ids2, hashes2 = ids[2:] + ["new"], hashes[2:] + ["hn"]
    hashes2[0] = "changed"
    todo = idx.missing(ids2, hashes2)
    assert todo.tolist() == [0, 28]
    extra = unit(rng, 2, 16)
    counts = idx.sync(ids2, hashes2, iter([extra[:1], extra[1:]]), rows=todo)
    assert counts == {"added": 2, "removed": 3, "kept": 27, "rebuilt": 0}
    want = np.vstack([extra[:1], m[3:], extra[1:]])
    assert np.allclose(idx.vectors(), want, atol=2e-3) and idx.ids == ids2
    with pytest.raises(ValueError, match="no stored vector"):
        idx.sync(ids2 + ["other"], hashes2 + ["x"], np.zeros((0, 16), np.float32), rows=np.zeros(0, np.int64))
    # an index saved by an earlier format than format 6 (a base without a patch) is reported, never misread
    _, id_map = VectorIndex.paths(tmp_path, "facts")
    lines = _id_map_lines(id_map)
    assert f'"format":{FORMAT}' in lines[0]
    _write_id_map(id_map, [lines[0].replace(f'"format":{FORMAT}', '"format":6'), *lines[1:]])
    assert VectorIndex.load(tmp_path, "facts", s).ids == ids          # format 6 still reads
    lines[0] = lines[0].replace(f'"format":{FORMAT}', '"format":5')
    _write_id_map(id_map, lines)
    with pytest.raises(HragError, match="another version"):
        VectorIndex.load(tmp_path, "facts", s)


def exact_search_ids(m: np.ndarray, ids: list[str], nq: int) -> list[list[str]]:
    rows, _ = exact_topk(m, m[:nq], 5)
    return [[ids[int(r)] for r in row] for row in rows]


def test_sparse_rows_are_stored_sparse_and_search_like_dense(tmp_path) -> None:
    """Builtin-like vectors (a few nonzero buckets) are stored as sparse rows: same answers, far fewer bytes,
    through an incremental sync and a save/load; a later dense batch keeps working."""
    rng = np.random.default_rng(11)
    n, dim = 400, 256
    m = np.zeros((n, dim), np.float32)
    for i in range(n):
        cols = rng.choice(dim, size=12, replace=False)
        m[i, cols] = rng.standard_normal(12)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    ids, hashes = ids_of(n), [f"h{i}" for i in range(n)]
    s = VectorSettings()
    idx = VectorIndex.build("facts", ids, m, s, "m", hashes=hashes)
    idx.save(tmp_path)
    # facts are posted: the values are kept once, by column, beside the row starts
    indptr_path, *row_values = VectorIndex.sparse_paths(tmp_path, "facts")
    assert indptr_path.exists() and not any(p.exists() for p in row_values)
    assert all(p.exists() for p in VectorIndex.query_paths(tmp_path, "facts"))
    assert not VectorIndex.matrix_path(tmp_path, "facts").exists()
    back = VectorIndex.load(tmp_path, "facts", s)
    assert back._rows.by_column_only
    assert back.search(m[:10], 5)[0] == [g[:5] for g in exact_search_ids(m, ids, 10)]
    assert back._rows.by_column_only                     # a query's search reads the postings alone
    got, sims = back.search(m[:30], 5)                   # more queries than postings serve: rows derived
    for a, b in ((back._rows.low, idx._rows.low), (back._rows.bands, idx._rows.bands),
                 (back._rows.data, idx._rows.data), (back._rows.indptr, idx._rows.indptr)):
        assert np.array_equal(np.asarray(a), np.asarray(b))    # the rows derived from the columns are the rows
    rows, exact = exact_topk(m, m[:30], 5)
    assert [g[0] for g in got] == ids[:30] and np.allclose(sims, exact, atol=2e-3)
    assert np.allclose(back.scores(m[7]), m @ m[7], atol=2e-3)
    # incremental: 10 removed, 5 added; then with exact_below 0, which still builds no graph for sparse rows
    ids2, hashes2 = ids[10:] + ids_of(5, "n"), hashes[10:] + [f"n{i}" for i in range(5)]
    m2 = np.vstack([m[10:], m[:5][:, ::-1]])
    todo = back.missing(ids2, hashes2)
    assert back.sync(ids2, hashes2, m2[todo], rows=todo)["added"] == 5
    assert np.allclose(np.asarray(back.vectors(), np.float32), m2, atol=2e-3)
    g = VectorIndex.build("facts", ids2, m2, VectorSettings(exact_below=0), "m", hashes=hashes2)
    assert g._index is None and g.search(m2[-1], 1)[0] == [[ids2[-1]]]
    g.save(tmp_path)
    assert not VectorIndex.paths(tmp_path, "facts")[0].exists()
    assert VectorIndex.load(tmp_path, "facts", VectorSettings(exact_below=0)).search(m2[3], 1)[0] == [[ids2[3]]]
    # a later dense batch turns the index dense and keeps the sparse rows' vectors
    dense = unit(rng, 3, dim)
    ids3, hashes3 = ids2 + ids_of(3, "d"), hashes2 + ["d0", "d1", "d2"]
    todo = back.missing(ids3, hashes3)
    assert back.sync(ids3, hashes3, dense, rows=todo)["added"] == 3 and back._rows.kind == "dense"
    assert np.allclose(np.asarray(back.vectors(), np.float32), np.vstack([m2, dense]), atol=2e-3)
    assert back.search(dense[1], 1)[0] == [[ids3[-2]]]


def test_sparse_sync_interleaves_new_rows_with_kept_ones_in_any_order() -> None:
    """An incremental sync of sparse rows places new rows between kept ones, and kept rows in a new order,
    row for row as a fresh build would (new rows arrive in blocks, some as SparseRows)."""
    rng = np.random.default_rng(5)
    dim = 512                                              # two bands of columns

    def sparse_unit(k: int) -> np.ndarray:
        m = np.zeros((k, dim), np.float32)
        for i in range(k):
            m[i, rng.choice(dim, size=int(rng.integers(1, 30)), replace=False)] = rng.standard_normal()
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    m = sparse_unit(300)
    ids = ids_of(300)
    idx = VectorIndex.build("facts", ids, m, VectorSettings(), "m", hashes=list(ids))
    order = rng.permutation(300)[:250]                     # 50 gone, the rest shuffled
    fresh = sparse_unit(40)
    ids2 = [ids[i] for i in order] + ids_of(40, "n")
    perm = rng.permutation(len(ids2))                      # new rows land anywhere
    ids2 = [ids2[i] for i in perm]
    want = np.vstack([m[order], fresh])[perm]
    todo = idx.missing(ids2, list(ids2))
    assert len(todo) == 40
    new_rows = want[todo]
    blocks = iter([sparse_rows(new_rows[:15]), new_rows[15:]])
    assert idx.sync(ids2, list(ids2), blocks, rows=todo) == {"added": 40, "removed": 50, "kept": 250, "rebuilt": 0}
    assert idx.rows().kind == "sparse" and idx.ids == ids2
    assert np.allclose(np.asarray(idx.vectors(), np.float32), want, atol=2e-3)


def test_an_index_whose_first_block_is_a_third_full_stays_sparse_without_a_graph() -> None:
    """Builtin entity texts sorted by id start with numbers and sums of money whose long descriptions fill a
    third of the buckets; the rest fill a few %. The index stays sparse rows (no HNSW graph at any size) and
    searches like the dense vectors; a dense embedder's blocks (every cell filled) stay dense."""
    rng = np.random.default_rng(8)
    dim = 256

    def filled(k: int, per_row: int) -> np.ndarray:
        m = np.zeros((k, dim), np.float32)
        for i in range(k):
            m[i, rng.choice(dim, size=per_row, replace=False)] = rng.standard_normal(per_row)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    m = np.vstack([filled(50, 85), filled(250, 8)])       # first block 33 % full, the whole 8 %
    ids = ids_of(300)
    idx = VectorIndex.create("entities", dim, VectorSettings(exact_below=10), "m")
    idx.sync(ids, list(ids), iter([m[:50], m[50:]]), rows=np.arange(300))
    assert idx.rows().kind == "sparse" and idx._index is None
    got, sims = idx.search(m[::7], 3)
    rows, exact = exact_topk(m, m[::7], 3)
    assert [g[0] for g in got] == [ids[r] for r in rows[:, 0]] and np.allclose(sims, exact, atol=2e-3)
    dense = VectorIndex.build("chunks", ids, unit(rng, 300, dim), VectorSettings(exact_below=10), "m", list(ids))
    assert dense.rows().kind == "dense" and dense._index is not None


def test_a_query_load_reads_mapped_ids_and_scores_through_the_postings(tmp_path) -> None:
    """A query's load (lazy ids) maps rows to ids and ids to rows from the saved keys, and scores a few
    queries through the column postings: the same ids, positions and scores (to float32 rounding) as the
    row scan of the index loaded for writing, across bands and for rows with no values at all."""
    rng = np.random.default_rng(5)
    n, dim = 700, 600
    m = np.zeros((n, dim), np.float32)
    for i in range(n - 3):                          # the last 3 rows stay empty
        cols = rng.choice(dim, size=int(rng.integers(1, 30)), replace=False)
        m[i, cols] = rng.standard_normal(len(cols))
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    m = m / np.where(norms > 0, norms, 1)
    ids = [f"é{i:04d}" if i % 3 else f"z{i}" for i in range(n)]      # not in id order, non-ASCII
    VectorIndex.build("facts", ids, m, VectorSettings(), "m", hashes=[f"h{i}" for i in range(n)]).save(tmp_path)
    scan = VectorIndex.load(tmp_path, "facts", VectorSettings())
    assert len(scan._rows.low) == int(scan._rows.indptr[-1])       # the rows, derived from the columns ...
    scan._rows.postings = None                                      # ... and scanned row by row
    lazy = VectorIndex.load(tmp_path, "facts", VectorSettings(), lazy_ids=True)
    assert lazy._rows.postings is not None and len(lazy.ids) == n and list(lazy.ids) == ids
    assert [lazy.position(i) for i in ids] == list(range(n)) and lazy.position("absent") is None
    assert lazy.ids[5] == ids[5] and lazy.ids[-1] == ids[-1] and lazy.hashes[4] == "h4"
    q = m[[0, 11, 250]] + 0.1 * m[[1, 12, 251]]
    assert np.allclose(lazy.scores(q[0]), scan.scores(q[0]), atol=1e-6)
    got, sims = lazy.search(q, 7)
    want, wsims = scan.search(q, 7)
    assert got == want and np.allclose(sims, wsims, atol=1e-6)


def test_postings_keep_rows_past_the_first_band_of_65536() -> None:
    """A posting's row is two bytes plus its band: rows beyond 65,536 score as the row scan scores them."""
    from hrag_cli.storage.vectors.sparse import build_postings

    rng = np.random.default_rng(2)
    n, dim = 140_000, 16
    m = np.zeros((n, dim), np.float32)
    m[np.arange(n), rng.integers(0, dim, n)] = 1.0
    m[np.arange(0, n, 3), rng.integers(0, dim, len(range(0, n, 3)))] += 0.5
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    rows = sparse_rows(m)
    q = rng.standard_normal((2, dim)).astype(np.float32)
    scan = np.concatenate([b for _, b in rows.blocks(q)], axis=1)
    rows.postings = build_postings(rows)
    assert rows.postings[2].shape == (dim, 3) and int(rows.postings[2].sum()) == len(rows.data)
    assert np.allclose(rows.posting_scores(q), scan, atol=1e-6)


def test_a_pruned_posting_search_gives_every_row_scored_bit_for_bit() -> None:
    """`posting_top` sums only the postings it needs, yet returns the rows and float32 scores that scoring
    every row gives (`posting_scores` then `top_order`), to the last bit: near-duplicate and identical rows
    (ties to the lower row), rows past the first band, k from 1 to 40, negative weights; a query that no row
    matches (every score 0: no bound prunes) scores every row."""
    from hrag_cli.storage.vectors.sparse import build_postings

    rng = np.random.default_rng(8)
    dim, n = 120, 66_000
    base = np.zeros((60, dim), np.float32)
    for i in range(60):
        cols = rng.choice(dim - 5, size=int(rng.integers(8, 30)), replace=False)
        base[i, cols] = rng.standard_normal(len(cols)) * rng.gamma(0.5, size=len(cols))
    m = base[rng.integers(0, 60, n)].copy()
    noise = rng.random((n, dim)) < 0.01
    noise[:, dim - 5:] = False                            # columns no row holds
    m[noise] += 0.3 * rng.standard_normal(int(noise.sum())).astype(np.float32)
    m[n - 500:] = m[n - 1000:n - 500]                     # identical rows: ties
    m[:50] = 0                                            # rows with no values
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    rows = sparse_rows(m / np.where(norms > 0, norms, 1))
    rows.postings = build_postings(rows)
    spied = {"full": 0}
    full_top = rows._full_top

    def counted(q, k):
        spied["full"] += 1
        return full_top(q, k)

    rows._full_top = counted
    queries = [base[i] + 0.05 * rng.standard_normal(dim).astype(np.float32) * (base[i] != 0) for i in range(12)]
    queries += [m[n - 700], -base[3], np.abs(rng.standard_normal(dim)).astype(np.float32)]
    queries += [np.where(np.arange(dim) >= dim - 5, 1.0, 0.0).astype(np.float32)]   # every score 0
    for i, q in enumerate(queries):
        q = (q / np.linalg.norm(q)).astype(np.float32)
        every = rows.posting_scores(q[None, :])[0]
        for k in (1, 5, 40):
            got, sims = rows.posting_top(q, k)
            want = top_order(every, k)
            assert got.tolist() == want.tolist() and sims.tobytes() == every[want].tobytes(), (i, k)
    assert spied["full"] == 3                             # only the query no row matches scored every row


def _spelled_scores(rows, q: np.ndarray) -> np.ndarray:
    """The plain way to score every row from the postings: each column's rows spelled out from its band
    counts, its float16 values widened by numpy, float32 products added column by column (np.add.at)."""
    ptr, plow, pbands, pdata = rows.postings
    out = np.zeros(len(rows), dtype=np.float32)
    for c in np.flatnonzero(q):
        s, e = int(ptr[c]), int(ptr[c + 1])
        at = np.repeat(np.arange(pbands.shape[1]) * 65536, np.asarray(pbands[c], dtype=np.intp)) + plow[s:e]
        np.add.at(out, at, np.asarray(pdata[s:e]).astype(np.float32) * q[c])
    return out


def test_float16_products_match_numpys_widening_bit_for_bit() -> None:
    """`products` (float16 widened by its bits) gives numpy's float32(value) * weight for every finite
    float16 (subnormals, zeros of both signs, the largest) and weights of either sign, tiny and subnormal."""
    from hrag_cli.storage.vectors.postings import products

    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    every = every[np.isfinite(every)]
    for w in (1.0, -1.0, 0.5, 0.0372, -0.7731, 1e-3, 3e-8, 1e-40, -2.5e-39, 1 / 3, 0.0):
        want = every.astype(np.float32) * np.float32(w)
        got = products(every, np.float32(w), np.empty(len(every), np.float32))
        assert got.view(np.int32).tolist() == want.view(np.int32).tolist(), w


def test_posting_scores_and_the_candidates_search_match_the_spelled_rows_bit_for_bit() -> None:
    """Chunk scores from the postings equal the plain spelled-out sum to the last bit (rows in three bands,
    columns no row holds, negative values), and a posting search's binary search in the band runs finds a
    row's entry exactly where the spelled rows have it: absent rows, rows sharing their low bytes with
    another band's entry, the first and last entries of a run, and as many rows as the spelled search takes."""
    from hrag_cli.storage.vectors.postings import _SEARCHED_ROWS
    from hrag_cli.storage.vectors.sparse import build_postings

    rng = np.random.default_rng(12)
    n, dim = 150_000, 40
    m = np.zeros((n, dim), np.float32)
    for j in range(6):
        m[np.arange(n), rng.integers(0, dim - 3, n)] += rng.standard_normal(n).astype(np.float32)
    m[70_000:70_100] = 0                                  # rows with no values
    m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-9)
    rows = sparse_rows(m)
    rows.postings = build_postings(rows)
    for _ in range(3):
        q = rng.standard_normal(dim).astype(np.float32) * (rng.random(dim) < 0.6)
        q /= np.linalg.norm(q)
        assert rows.posting_scores(q[None])[0].tobytes() == _spelled_scores(rows, q).tobytes()
    q = np.full(dim, 1 / np.sqrt(dim), np.float32)
    post = rows._gather(np.flatnonzero(q))
    ptr, plow, pbands, _ = rows.postings
    probe = np.unique(np.concatenate([
        rng.integers(0, n, 600), [0, 1, 65_535, 65_536, 65_537, 131_072, n - 1], np.arange(70_000, 70_100, 9),
        [int(plow[int(ptr[c])]) + 65_536 * b for c in range(5) for b in range(3)]]))  # another band's low bytes
    every = _spelled_scores(rows, q)
    assert len(probe) <= _SEARCHED_ROWS < 3000            # the first probe takes `_search`, the second one
    for probe in (probe, np.arange(3000) * 50):           # (past _SEARCHED_ROWS rows) `_search_spelled`
        assert post.exact(probe, q).tobytes() == every[probe].tobytes()
    m[65_536:] = 0                                        # rows searched where no column has a run at all
    rows = sparse_rows(m)
    rows.postings = build_postings(rows)
    assert rows._gather(np.flatnonzero(q)).exact(np.array([70_000, n - 1]), q).tolist() == [0.0, 0.0]


def test_a_posting_search_whose_candidates_stay_many_still_gives_every_row_scored() -> None:
    """10,000 copies of one row (more than a search counts before listing, and not halving: a tie) stay
    candidates through the last column and are scored through the spelled-out columns; the top k is still
    every row scored's (the lowest rows of the tie)."""
    from hrag_cli.storage.vectors.sparse import _LISTED_CANDIDATES, build_postings

    rng = np.random.default_rng(13)
    n, dim = 30_000, 64
    m = rng.standard_normal((n, dim)).astype(np.float32) * (rng.random((n, dim)) < 0.1)
    m[5_000:15_000] = m[0]
    m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-9)
    rows = sparse_rows(m)
    rows.postings = build_postings(rows)
    q = m[0].astype(np.float32)
    got, sims = rows.posting_top(q, 5)
    every = rows.posting_scores(q[None])[0]
    assert int((every >= every[0]).sum()) > _LISTED_CANDIDATES
    assert got.tolist() == top_order(every, 5).tolist() == [0, 5_000, 5_001, 5_002, 5_003]
    assert sims.tobytes() == every[got].tobytes()


def test_top_order_is_the_stable_descending_sort_cut() -> None:
    """The m best, ties to the lower index, as np.argsort(-x, kind="stable")[:m], over ties, zeros and sizes
    where the block-maximum floor is used and where it is not."""
    rng = np.random.default_rng(11)
    for t in range(200):
        n = int(rng.integers(1, 20_000))
        x = rng.random(n).astype(np.float32 if t % 2 else np.float64)
        if t % 3 == 0:
            x = np.round(x, 2)
        if t % 5 == 0:
            x[rng.random(n) < 0.9] = 0
        if t % 7 == 0:                      # -0.0 ties with 0.0
            x[rng.random(n) < 0.5] = 0
            x[rng.random(n) < 0.3] = -0.0
        m = int(rng.integers(1, 300))
        assert top_order(x, m).tolist() == np.argsort(-x, kind="stable")[:m].tolist()


def test_a_query_reads_postings_at_offsets_and_a_truncated_file_or_bad_band_counts_are_errors(tmp_path) -> None:
    """A query's load reads the postings' rows and values with pread (not mapped); a file cut short after the
    load is reported with its fix, never read as zeros."""
    rng = np.random.default_rng(6)
    m = np.zeros((300, 64), np.float32)
    for i in range(300):
        m[i, rng.choice(64, size=5, replace=False)] = rng.random(5) + 0.1
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    VectorIndex.build("facts", ids_of(300), m, VectorSettings(), "m").save(tmp_path)
    lazy = VectorIndex.load(tmp_path, "facts", VectorSettings(), lazy_ids=True)
    assert isinstance(lazy._rows.postings[1], ReadAt) and isinstance(lazy._rows.postings[3], ReadAt)
    got, _ = lazy.search(m[:3], 1)
    assert got == [["x0"], ["x1"], ["x2"]]
    data = VectorIndex.query_paths(tmp_path, "facts")[6]
    data.write_bytes(data.read_bytes()[:-64])
    with pytest.raises(HragError, match="truncated"):
        lazy.search(np.full((1, 64), 0.125, np.float32), 1)     # every column: the last one is cut

    # band counts that do not fill their column's run (one entry moved to another column: same total) are
    # damage a query would otherwise read as rows of the wrong band
    VectorIndex.build("facts", ids_of(300), m, VectorSettings(), "m").save(tmp_path)
    assert VectorIndex.load(tmp_path, "facts", VectorSettings(), lazy_ids=True) is not None
    bands_path = VectorIndex.query_paths(tmp_path, "facts")[5]
    bands = np.load(bands_path)
    moved = int(np.flatnonzero(bands[:, 0])[0])
    bands[moved, 0] -= 1
    bands[(moved + 1) % len(bands), 0] += 1
    np.save(bands_path, bands)
    with pytest.raises(HragError, match="hrag synonyms"):
        VectorIndex.load(tmp_path, "facts", VectorSettings(), lazy_ids=True)


@pytest.mark.parametrize("n, dim, name", [(300, 512, "facts"), (70_000, 24, "facts"), (3000, 300, "entities")])
def test_an_insertion_into_a_saved_index_gives_a_fresh_builds_bytes(tmp_path, n, dim, name) -> None:
    """A posted index loaded by column (as the synonyms stage loads facts and chunks) takes inserted, re-made
    and removed rows without deriving its rows: still by column only, and saved it is a fresh build's files,
    byte for byte (across bands of columns, and past the first band of 65,536 rows). An index kept by row
    (entities) copies its kept rows run by run, to the same bytes."""
    rng = np.random.default_rng(n)

    def sparse_unit(k: int) -> np.ndarray:
        m = rng.standard_normal((k, dim)).astype(np.float32) * (rng.random((k, dim)) < 6 / dim)
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return m / np.where(norms > 0, norms, 1)

    m = sparse_unit(n)
    ids = ids_of(n)
    VectorIndex.build(name, ids, m, VectorSettings(), "m", hashes=list(ids)).save(tmp_path / "a")
    idx = VectorIndex.load(tmp_path / "a", name, VectorSettings())
    assert idx.rows().by_column_only == (name == "facts")
    keep = np.sort(rng.choice(n, size=n - n // 20, replace=False))       # some rows go, the rest keep order
    fresh = sparse_unit(n // 10)
    slots = np.sort(rng.integers(0, len(keep) + 1, len(fresh)))          # new rows land between kept ones
    ids2 = list(np.insert(np.array([ids[i] for i in keep], dtype=object), slots, ids_of(len(fresh), "n")))
    want = np.insert(m[keep], slots, fresh, axis=0)
    hashes2 = list(ids2)
    hashes2[3] = "remade"                                                 # a kept id whose text changed
    want[3] = fresh[0]
    todo = idx.missing(ids2, hashes2)
    assert idx.sync(ids2, hashes2, want[todo], rows=todo)["added"] == len(todo)
    assert idx.rows().by_column_only == (name == "facts")
    idx.save(tmp_path / "b")
    VectorIndex.build(name, ids2, want, VectorSettings(), "m", hashes=hashes2).save(tmp_path / "c")
    for path in sorted((tmp_path / "c").iterdir()):
        assert (tmp_path / "b" / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("n", [300, 65_000, 70_000])     # 65,000: the appended rows open band 1
def test_rows_appended_to_a_posted_index_give_a_fresh_builds_bytes(tmp_path, n) -> None:
    """Rows only appended (the chunk index of a +1 %): each column's old postings are copied as they are and
    the new entries follow; saved, a fresh build's files byte for byte (also where the new rows open a band)."""
    rng = np.random.default_rng(n + 1)
    dim = 24
    m = rng.standard_normal((n + n // 20 + 7, dim)).astype(np.float32) * (rng.random((n + n // 20 + 7, dim)) < 0.3)
    m /= np.where(np.linalg.norm(m, axis=1, keepdims=True) > 0, np.linalg.norm(m, axis=1, keepdims=True), 1)
    ids = ids_of(len(m))
    VectorIndex.build("chunks", ids[:n], m[:n], VectorSettings(), "m", hashes=ids[:n]).save(tmp_path / "a")
    idx = VectorIndex.load(tmp_path / "a", "chunks", VectorSettings())
    assert idx.rows().by_column_only
    todo = idx.missing(ids, ids)
    assert todo.tolist() == list(range(n, len(m))) and idx.sync(ids, ids, m[todo], rows=todo)["added"] == len(todo)
    idx.save(tmp_path / "b")
    VectorIndex.build("chunks", ids, m, VectorSettings(), "m", hashes=ids).save(tmp_path / "c")
    for path in sorted((tmp_path / "c").iterdir()):
        assert (tmp_path / "b" / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("name", ["facts", "entities"])
def test_insert_splices_ids_hashes_and_rows_into_a_fresh_builds_bytes(tmp_path, name) -> None:
    """`insert` on an index loaded with lazy ids (no Python list of them): ids inserted anywhere (at the
    front, between rows, at the end; ids of other lengths and non-ASCII), rows made again in place; saved,
    every file is a fresh build's, and the digest is the fresh build's."""
    rng = np.random.default_rng(11)
    dim, n = 300, 400

    def sparse_unit(k: int) -> np.ndarray:
        m = rng.standard_normal((k, dim)).astype(np.float32) * (rng.random((k, dim)) < 8 / dim)
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return m / np.where(norms > 0, norms, 1)

    ids = [f"k{i:05d}" if i % 5 else f"k{i:05d}é-longer" for i in range(n)]
    m = sparse_unit(n)
    hashes = [f"h{i}" for i in range(n)]
    VectorIndex.build(name, ids, m, VectorSettings(), "m", hashes=hashes).save(tmp_path / "a")
    if name == "facts":                    # a query's load reads the postings by pread: never spliced
        assert not VectorIndex.load(tmp_path / "a", name, VectorSettings(), lazy_ids=True).insertable()
    idx = VectorIndex.load(tmp_path / "a", name, VectorSettings(), lazy_ids=True, read_at=False)
    assert idx.insertable()
    before = np.array([0, 0, 7, 7, 200, n])                # ahead of row 0 twice, of 7 twice, ..., at the end
    new_ids = ["a0", "a1", "k00006z", "k00006zz", "k00199x", "zz-last"]
    remade = [3, 150]                                      # rows made again from new texts
    listed = sorted([(int(b), 0, i) for b, i in zip(before, new_ids)] + [(r, 1, ids[r]) for r in remade])
    final_ids = [x[2] for x in listed]
    old_rows = np.array([-1 if x[1] == 0 else x[0] for x in listed])
    at = np.array([x[0] for x in listed])
    vecs = sparse_unit(len(listed))
    new_hashes = [f"n{i}" for i in range(len(listed))]
    counts = idx.insert(final_ids, new_hashes, old_rows, at, vecs)
    assert counts["added"] == len(listed) and len(idx) == n + len(new_ids)
    idx.synced = "t"
    idx.save(tmp_path / "b")
    all_m, all_h = list(m), list(hashes)
    for (row, kind, _), v, h in zip(listed, vecs, new_hashes):
        if kind:                                           # made again in place
            all_m[row], all_h[row] = v, h
    # the final order: every inserted id ahead of its old row, in listed order
    out_ids, out_m, out_h = [], [], []
    inserted = [(x, v, h) for x, v, h in zip(listed, vecs, new_hashes) if x[1] == 0]
    for r in range(n + 1):
        for (b, _, i), v, h in inserted:
            if b == r:
                out_ids.append(i), out_m.append(v), out_h.append(h)
        if r < n:
            out_ids.append(ids[r]), out_m.append(all_m[r]), out_h.append(all_h[r])
    fresh = VectorIndex.build(name, out_ids, np.array(out_m), VectorSettings(), "m", hashes=out_h)
    fresh.synced = "t"
    fresh.save(tmp_path / "c")
    for path in sorted((tmp_path / "c").iterdir()):
        assert (tmp_path / "b" / path.name).read_bytes() == path.read_bytes(), path.name
    back = VectorIndex.load(tmp_path / "b", name, VectorSettings())
    assert back.ids == out_ids and back.hashes == out_h and idx.digest() == fresh.digest() == back.digest()
    assert np.array_equal(idx.id_array(), fresh.id_array())     # the spliced fixed-width ids, as a build's
    with pytest.raises(ValueError, match="final order"):
        back.insert(["x", "y"], ["1", "2"], np.array([-1, -1]), np.array([5, 2]), sparse_unit(2))


@pytest.mark.parametrize("name", ["facts", "entities", "chunks"])
def test_a_patched_index_reads_searches_and_folds_as_a_fresh_build(tmp_path, name) -> None:
    """Two incremental runs' inserts saved where the index is: the base files stay as they were (a patch
    segment beside them), and what a reader sees is a fresh build's: ids, hashes, rows, positions, digest, and
    search results with the same float32 scores (one query through the postings, a batch through the row scan;
    ties to the lower row); a third insert past `base_patch.VECTOR_INDEX` folds the patch into a fresh build's very files."""
    rng = np.random.default_rng(7)
    dim, n = 96, 600

    def sparse_unit(k: int) -> np.ndarray:
        m = rng.standard_normal((k, dim)).astype(np.float32) * (rng.random((k, dim)) < 10 / dim)
        m[:, 0] += 0.01                                    # no empty row
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    ids, m, hashes = [f"k{i:04d}" for i in range(0, 2 * n, 2)], sparse_unit(n), [f"h{i:05d}" for i in range(n)]
    m[5] = m[9]                                            # a tie: the lower row first
    d = tmp_path / "p"
    VectorIndex.build(name, ids, m, VectorSettings(), "m", hashes=hashes).save(d)
    base = {p.name: p.read_bytes() for p in d.iterdir()}
    rows = {i: (v, h) for i, v, h in zip(ids, m, hashes)}
    first = dict(zip(ids, m))
    fresh_ids: list[str] = []
    for run, k_new in enumerate((12, 9, 80)):
        idx = VectorIndex.load(d, name, VectorSettings(), lazy_ids=True, read_at=False)
        order = sorted(rows)
        remade = [] if name == "chunks" else sorted(set(rng.choice(order, size=3, replace=False).tolist())
                                                    | set(fresh_ids[:1]))   # a row the patch holds, made again
        fresh_ids = [f"k{2 * int(rng.integers(0, n)) + 1:04d}r{run}" for _ in range(k_new)]
        if name == "chunks":                               # chunks are appended
            fresh_ids = [f"z{run}-{j:03d}" for j in range(k_new)]
        fresh_ids = sorted(set(fresh_ids) - set(rows))
        final = sorted(set(order) | set(fresh_ids))
        listed = sorted(set(fresh_ids) | set(remade), key=final.index)
        old_rows = np.array([order.index(i) if i in rows else -1 for i in listed], dtype=np.int64)
        before = np.array([r if r >= 0 else sum(1 for o in order if o < i) for i, r in zip(listed, old_rows)])
        vecs = sparse_unit(len(listed))
        new_hashes = [f"r{run}{j:04d}" for j in range(len(listed))]     # as wide as the base's: digested by runs
        idx.insert(listed, new_hashes, old_rows, before, vecs)
        idx.save(d)
        for i, v, h in zip(listed, vecs, new_hashes):
            rows[i] = (v, h)
        patched = VectorIndex.patch_path(d, name).exists()
        assert patched == (run < 2), run
        if patched:       # the base's files untouched, only the patch and the id map written
            assert [p for p, b in base.items() if p != f"{name}.ids.jsonl" and (d / p).read_bytes() != b] == []
        want_ids = sorted(rows)
        want = np.array([rows[i][0] for i in want_ids])
        fresh = VectorIndex.build(name, want_ids, want, VectorSettings(), "m", hashes=[rows[i][1] for i in want_ids])
        fresh.synced = idx.synced
        fresh.save(tmp_path / f"fresh{run}")
        fresh = VectorIndex.load(tmp_path / f"fresh{run}", name, VectorSettings(), lazy_ids=True)
        got = VectorIndex.load(d, name, VectorSettings(), lazy_ids=True)
        assert list(got.ids) == want_ids and got.hash_array().tolist() == fresh.hash_array().tolist()
        assert np.array_equal(got.vectors(), fresh.vectors()) and got.digest() == fresh.digest()
        assert [got.position(i) for i in want_ids[::7]] == [fresh.position(i) for i in want_ids[::7]]
        assert got.position("nope") is None and got.ids[len(want_ids) - 1] == want_ids[-1]
        asked = np.array([*range(0, len(want_ids), 5), *[want_ids.index(i) for i in listed], -1])
        assert got.hash_rows(asked) == idx.hash_rows(asked) == fresh.hash_rows(asked)
        got.id_order()                                     # the base's fixed-width ids kept, then spliced
        assert got.id_array().tobytes() == idx.id_array().tobytes() == fresh.id_array().tobytes()
        whole = VectorIndex.load(d, name, VectorSettings())         # a writer's load: every id listed
        assert whole.ids == want_ids and whole.hashes == [rows[i][1] for i in want_ids]
        assert np.array_equal(whole.vectors(), fresh.vectors()) and whole.digest() == fresh.digest()
        # the old vector of a row made again: its base row leads the base's search but is not live
        q = np.vstack([m[9], first.get(remade[0] if remade else "", m[9]), sparse_unit(20)])
        for qs in (q[:3], q):                               # through the postings, then the row scan
            a, b = got.search(qs, 8), fresh.search(qs, 8)
            assert a[0] == b[0] and a[1].tobytes() == b[1].tobytes(), (run, len(qs))
        assert got.scores(q[1]).tobytes() == fresh.scores(q[1]).tobytes()
        if not patched:   # folded: a fresh build's files, byte for byte (the id map's header aside: its `synced`)
            assert [p.name for p in (tmp_path / f"fresh{run}").iterdir() if not p.name.endswith(".ids.jsonl")
                    and p.read_bytes() != (d / p.name).read_bytes()] == []
    # a damaged patch is reported, never read as something else (after a run that put nothing in it)
    idx = VectorIndex.load(d, name, VectorSettings(), lazy_ids=True, read_at=False)
    idx.insert(["zzz"], ["hz"], np.array([-1]), np.array([len(idx)]), sparse_unit(1))
    idx.save(d)
    idx = VectorIndex.load(d, name, VectorSettings(), lazy_ids=True, read_at=False)
    assert idx.insert([], [], np.zeros(0, np.int64), np.zeros(0, np.int64), iter([]))["added"] == 0
    idx.save(d)
    assert list(VectorIndex.load(d, name, VectorSettings(), lazy_ids=True).ids) == [*sorted(rows), "zzz"]
    # a writer's load folds the patch: its next insert saves the whole index, never a patch over the old base
    d2 = tmp_path / "whole"
    shutil.copytree(d, d2)
    whole = VectorIndex.load(d2, name, VectorSettings())
    whole.insert(["zzzz"], ["hzz"], np.array([-1]), np.array([len(whole)]), sparse_unit(1))
    whole.save(d2)
    assert list(VectorIndex.load(d2, name, VectorSettings(), lazy_ids=True).ids) == [*sorted(rows), "zzz", "zzzz"]
    # an insert of nothing on an index without a patch: the id map alone is written, every array file stays
    files = {p.name: (p.stat().st_ino, p.read_bytes()) for p in d2.iterdir() if p.suffix == ".npy"}
    idx = VectorIndex.load(d2, name, VectorSettings(), lazy_ids=True, read_at=False)
    idx.insert([], [], np.zeros(0, np.int64), np.zeros(0, np.int64), iter([]))
    idx.synced = "again"
    idx.save(d2)
    assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in d2.iterdir() if p.suffix == ".npy"} == files
    back = VectorIndex.load(d2, name, VectorSettings(), lazy_ids=True)
    assert back.synced == "again" and list(back.ids) == [*sorted(rows), "zzz", "zzzz"]
    patch, ids_path = VectorIndex.patch_path(d, name), VectorIndex.paths(d, name)[1]
    good, meta = patch.read_bytes(), next(iter(store.read_jsonl(ids_path)))["_meta"]
    damaged = [lambda: patch.write_bytes(good[:-10]),                                  # cut
               lambda: patch.write_bytes(good[:len(good) // 2] + bytes([good[len(good) // 2] ^ 0xFF])
                                         + good[len(good) // 2 + 1:]),                  # one byte flipped
               patch.unlink,                                                           # gone
               lambda: store.write_jsonl(ids_path, [{"_meta": {**meta, "patch": {
                   **meta["patch"], "count": meta["patch"]["count"] + 1}}}], compress=True),   # the id map's count
               lambda: store.write_jsonl(ids_path, [{"_meta": {**meta, "patch": [1]}}], compress=True)]
    for damage in damaged:
        damage()
        with pytest.raises(HragError, match="patch of index"):
            VectorIndex.load(d, name, VectorSettings(), lazy_ids=True)
        patch.write_bytes(good)
        store.write_jsonl(ids_path, [{"_meta": meta}], compress=True)
        assert len(VectorIndex.load(d, name, VectorSettings(), lazy_ids=True)) == len(rows) + 1


def test_fixed_width_pads_ragged_ids_and_views_even_ones() -> None:
    from hrag_cli.storage.vectors.ids import IdKeys, fixed_width

    ids = ["b", "", "ccc", "\u00e9t\u00e9", "a" * 70, "zz"]
    blob, off, _ = IdKeys.arrays(ids)
    got = fixed_width(blob, off)
    assert got.dtype == np.dtype("S70") and got.tolist() == [i.encode("utf-8") for i in ids]
    even = IdKeys.arrays(["ab", "cd", "ef"])
    assert fixed_width(*even[:2]).tolist() == [b"ab", b"cd", b"ef"]
    assert np.shares_memory(fixed_width(*even[:2]), even[0])      # a view of the blob, not a copy
    assert len(fixed_width(np.zeros(0, np.uint8), np.zeros(1, np.int64))) == 0


def test_id_arrays_are_the_bytes_end_to_end_and_their_byte_order() -> None:
    from hrag_cli.storage.vectors.ids import IdKeys, fixed_bytes

    ids = ["b", "", "ab", "a", "\u00e9t\u00e9", "\u4e2d", "a" * 40, "Zz", "a b"]
    blob, off, order = IdKeys.arrays(ids)
    enc = [i.encode("utf-8") for i in ids]
    assert bytes(blob) == b"".join(enc) and off.tolist() == [0, *np.cumsum([len(e) for e in enc]).tolist()]
    assert order.dtype == np.int64 and order.tolist() == sorted(range(len(ids)), key=enc.__getitem__)
    assert fixed_bytes(ids).tolist() == enc and fixed_bytes([]).shape == (0,)


def test_scratch_arrays_are_kept_and_filled_only_when_made() -> None:
    from hrag_cli.storage.scratch import scratch

    buffers: dict = {}
    ones = scratch(buffers, "ones", 10, np.intp, fill=1)
    assert ones.shape == (10,) and (ones == 1).all()
    ones[3] = 7                                           # a caller's mark stays: the array is kept, not refilled
    again = scratch(buffers, "ones", 20, np.intp, fill=1)
    assert again[3] == 7 and np.shares_memory(again, ones)
    grown = scratch(buffers, "ones", 1 << 17, np.intp, fill=1)   # past the kept size: a new array, filled
    assert (grown == 1).all() and not np.shares_memory(grown, ones)

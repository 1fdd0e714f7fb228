"""The synonyms stage on hand-made vectors (served by the stub's embeddings route): threshold, top-k, short-name
skip, de-duplication, incremental neighbour lists, review/accept, and the SYNONYM edges in the graph."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrag_cli.core import base_patch, line_patch, store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.graph.model import SYNONYM, build_graph, load_graph, save_graph
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import Chunk, ChunkRef, Document, Entity, to_dict
from hrag_cli.embed.review import DECISIONS_FILE
from hrag_cli.embed.stage import run_synonyms
from hrag_cli.embed.synonym_edges import KNN_FILE
from hrag_cli.storage.vectors.index import VectorIndex
from tests.stub_server import hash_vector
from tests.stub_server import stub_settings

ROOT = Path(__file__).resolve().parent.parent
QUIET = Reporter("quiet")


def mix(a: int, b: int, cos: float) -> list[float]:
    """Unit vector at cosine `cos` from basis vector e_a, leaning towards e_b."""
    v = [0.0] * 8
    v[a] = cos
    v[b] += math.sqrt(max(0.0, 1.0 - cos * cos))
    return v


# name -> vector of the entity-name text; cos(A,B)=.95, cos(A,C)=.85, cos(B,C)=.8075, cos(D,E)=.9
NAMES = {
    "New York City": mix(0, 0, 1.0),
    "New York": mix(0, 1, 0.95),
    "Big Apple": mix(0, 2, 0.85),
    "NY": mix(0, 0, 1.0),            # identical to New York City, but only 2 letters: never linked
    "London": mix(3, 3, 1.0),
    "Greater London": mix(3, 4, 0.9),
    "Paris": mix(5, 5, 1.0),
    "Tokyo": mix(6, 6, 1.0),
}
EXTRA = {"Greater London Area": mix(3, 7, 0.95)}


def ent(name: str) -> Entity:
    return Entity(id=name.lower(), name=name, type="location", description=f"{name} is a place.",
                  source_ids=["c1"])


def embed_fn(body: dict) -> list[list[float]]:
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    vectors = {**NAMES, **EXTRA}
    return [vectors.get(t, hash_vector(t)) for t in inputs]


def make_project(tmp_path: Path, names: list[str]) -> ProjectDir:
    p = ProjectDir(tmp_path / "proj")
    p.init()
    chunks = [Chunk("c1", "d1", 0, 6, "New York City and London are big."),
              Chunk("c2", "d1", 1, 4, "Paris and Tokyo too.")]
    entities = [ent(n) for n in names]
    store.write_jsonl(p.chunks_path, [to_dict(c) for c in chunks])
    store.write_jsonl(p.entities_path, [to_dict(e) for e in entities])
    store.write_jsonl(p.relations_path, [])
    store.write_jsonl(p.facts_path, [])
    graph = build_graph([Document("d1", "a.txt", "sha", 10, 2)], [ChunkRef(c.chunk_id, c.doc_id, c.order) for c in chunks],
                        entities, [], [("c1", e.id, 1) for e in entities])
    save_graph(p, graph)
    return p


def settings_for(stub, **syn) -> Settings:
    return stub_settings(stub, embed_model="openai/stub-embed", retries=0, section="synonyms", **syn)


def run(p: ProjectDir, s: Settings, **kw):
    with p.lock():
        return run_synonyms(p, s, QUIET, **kw)


def pairs_in_file(p: ProjectDir) -> dict[tuple[str, str], float]:
    return {(r["a"], r["b"]): r["similarity"] for r in store.read_jsonl(p.synonyms_path)}


def pairs_in_graph(p: ProjectDir) -> dict[tuple[str, str], float]:
    g, _ = load_graph(p)
    out = {}
    for e in g.es.select(kind_eq=SYNONYM):
        a, b = sorted((g.vs[e.source]["key"], g.vs[e.target]["key"]))
        assert (a, b) not in out
        out[(a, b)] = e["weight"]
    return out


AB, AC, BC, DE = ("new york", "new york city"), ("big apple", "new york city"), ("big apple", "new york"), \
    ("greater london", "london")


def test_threshold_short_names_dedup_and_graph(tmp_path: Path, stub) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    out = run(p, settings_for(stub))
    got = pairs_in_file(p)
    assert set(got) == {AB, AC, BC, DE}                      # NY (2 letters) skipped, each pair once
    # the name vectors are stored as float16 unit rows (storage/vectors): cosines move by < 1e-3
    assert got[AB] == pytest.approx(0.95, abs=1e-3) and got[BC] == pytest.approx(0.8075, abs=1e-3)
    assert pairs_in_graph(p) == pytest.approx(got)           # the graph gains exactly the listed edges
    assert out.counts["synonym_pairs"] == 4 and out.counts["vectors_entities"] == len(NAMES)
    assert out.counts["vectors_chunks"] == 2 and out.output_digest

    s = settings_for(stub, threshold=0.88)
    run(p, s)
    assert set(pairs_in_file(p)) == {AB, DE} and set(pairs_in_graph(p)) == {AB, DE}   # old edges replaced


def test_top_k_limits_each_entitys_list(tmp_path: Path, stub) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    run(p, settings_for(stub, top_k=1))
    # New York City's single neighbour is NY (filtered); B and C each keep only A: B-C is lost
    assert set(pairs_in_file(p)) == {AB, AC, DE}


def test_min_name_chars_setting(tmp_path: Path, stub) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    run(p, settings_for(stub, min_name_chars=2))
    assert ("new york city", "ny") in pairs_in_file(p)


def test_second_run_embeds_nothing_and_new_entities_are_compared_against_the_index(
        tmp_path: Path, stub, monkeypatch: pytest.MonkeyPatch) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    s = settings_for(stub)
    p.vectors_dir.mkdir(parents=True, exist_ok=True)
    old_graph = [p.vectors_dir / f"entity_names{x}" for x in (".hnsw", ".ids.jsonl", ".pca.npy")]
    for f in old_graph:                                     # the name graph of earlier versions
        f.write_bytes(b"old")
    first = run(p, s)
    assert first.counts["entities_queried"] == len(NAMES)
    assert not old_graph[0].exists() and not old_graph[2].exists()
    names = VectorIndex.load(p.vectors_dir, "entity_names", s.vectors)     # the name vectors, kept for next time
    assert names is not None and len(names) == len(NAMES)
    requests = stub.count("/embeddings")
    again = run(p, s)
    assert again.counts["embedded_now"] == 0 and again.counts["entities_queried"] == 0
    assert stub.count("/embeddings") == requests and again.output_digest == first.output_digest

    p2 = make_project(tmp_path / "grown", list(NAMES) + list(EXTRA))
    for f in p.vectors_dir.iterdir():                       # same project state as before, plus one entity
        (p2.vectors_dir / f.name).write_bytes(f.read_bytes())
    for f in p.embeddings_dir.iterdir():
        (p2.embeddings_dir / f.name).write_bytes(f.read_bytes())
    # one entity more changes most lists of so few: kept as a patch all the same, so the next run reads one back
    monkeypatch.setattr(base_patch, "NEIGHBOUR_LISTS", base_patch.FoldShare(1.0))
    grown = run(p2, s)
    assert grown.counts["entities_queried"] == 1
    # the new entity embedded: its name and its name+description (chunks/others were cached)
    assert grown.counts["embedded_now"] == 2
    incremental = pairs_in_file(p2)
    assert ("greater london area", "london") in incremental
    assert line_patch.patch_path(p2.vectors_dir / KNN_FILE).exists()     # the lists as the base and a patch
    loaded = run(p2, s)                                     # a run from the base and the patch read back
    assert loaded.counts["entities_queried"] == 0 and pairs_in_file(p2) == incremental
    (p2.vectors_dir / KNN_FILE).unlink()                    # from scratch gives the same edges
    run(p2, s)
    assert pairs_in_file(p2) == pytest.approx(incremental)


def test_review_then_accept_round_trip(tmp_path: Path, stub) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    s = settings_for(stub)
    tsv = tmp_path / "review.tsv"
    out = run(p, s, review_path=tsv)
    assert out.counts["review_only"] == 1 and out.counts["review_pairs"] == 4
    assert not p.synonyms_path.exists() and pairs_in_graph(p) == {}     # nothing applied
    lines = tsv.read_text().splitlines()
    assert lines[0].split("\t") == ["a", "b", "a_name", "b_name", "similarity", "action"]
    rows = [ln.split("\t") for ln in lines[1:]]
    assert [r[5] for r in rows] == ["link"] * 4
    assert rows[0][:4] == ["new york", "new york city", "New York", "New York City"]   # best first

    edited = [lines[0]]
    for r in rows:
        if (r[0], r[1]) == AC:
            r[5] = "skip"
        if (r[0], r[1]) == DE:
            r[5] = "merge"
        edited.append("\t".join(r))
    edited.append("\t".join(["paris", "tokyo", "Paris", "Tokyo", "", "LINK"]))   # a pair the model missed
    tsv.write_text("\n".join(edited) + "\n")
    out = run(p, s, accept_path=tsv)
    got = pairs_in_file(p)
    assert set(got) == {AB, BC, DE, ("paris", "tokyo")}
    assert got[DE] == 1.0 and got[("paris", "tokyo")] == pytest.approx(0.0, abs=1e-6)
    assert pairs_in_graph(p) == pytest.approx(got)
    assert out.counts["synonym_merges"] == 1 and out.counts["accepted_rows"] == 5
    merges = [r for r in store.read_jsonl(p.graph_dir / DECISIONS_FILE) if r["action"] == "merge"]
    assert [(r["a"], r["b"]) for r in merges] == [DE]

    # decisions persist: a later plain run (even at another threshold) still honours them
    run(p, settings_for(stub, threshold=0.7))
    later = pairs_in_file(p)
    assert AC not in later and later[DE] == 1.0 and ("paris", "tokyo") in later


@pytest.mark.parametrize("body,message", [
    ("a\tb\tsimilarity\taction\nnew york\tnew york city\t0.9\tmaybe\n", "action must be"),
    ("a\tb\tsimilarity\taction\nnew york\tatlantis\t0.9\tlink\n", "unknown entity id 'atlantis'"),
    ("x\ty\nnew york\tnew york city\n", "first line must name"),
    ("a\tb\taction\nnew york\n", "columns"),
])
def test_bad_review_file_changes_nothing(tmp_path: Path, stub, body: str, message: str) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    s = settings_for(stub)
    run(p, s)
    before = (p.synonyms_path.read_bytes(), p.graph_path.read_bytes())
    bad = tmp_path / "bad.tsv"
    bad.write_text(body)
    with pytest.raises(UsageError, match=message):
        run(p, s, accept_path=bad)
    assert (p.synonyms_path.read_bytes(), p.graph_path.read_bytes()) == before
    assert not (p.graph_dir / DECISIONS_FILE).exists()
    with pytest.raises(UsageError, match="does not exist"):
        run(p, s, accept_path=tmp_path / "missing.tsv")
    with pytest.raises(UsageError, match="together"):
        run(p, s, accept_path=bad, review_path=tmp_path / "r.tsv")


@pytest.mark.parametrize("key,value", [("cells_per_entity", 0), ("cell_size", 1), ("top_k", 0),
                                       ("min_name_chars", -1), ("threshold", 2.0)])
def test_out_of_range_settings_stop_before_anything_is_written(tmp_path: Path, stub, key: str, value) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    s = settings_for(stub)
    setattr(s.synonyms, key, value)
    with pytest.raises(UsageError, match=f"synonyms.{key}"):
        run(p, s)
    assert not p.vectors_dir.exists() or not any(p.vectors_dir.iterdir())
    assert stub.count("/embeddings") == 0


def test_cli_on_the_sample_corpus(tmp_path: Path, monkeypatch) -> None:
    """The builtin embedder end to end: index builds every index; --review leaves the stage as it was;
    re-running resolve brings the SYNONYM edges back; status shows the IDF state."""
    from hrag_cli.cli import app

    monkeypatch.delenv("HRAG_EMBED_MODEL", raising=False)
    runner = CliRunner()
    proj = tmp_path / "p"
    res = runner.invoke(app, ["index", str(ROOT / "sample_corpus"), "-p", str(proj), "-q", "--json"])
    assert res.exit_code == 0, res.output
    p = ProjectDir(proj)
    for name in ("chunks", "entities", "facts"):
        idx = VectorIndex.load(p.vectors_dir, name, Settings().vectors)
        assert idx is not None and len(idx) > 0 and idx.model_id.startswith("builtin")
    assert VectorIndex.load(p.vectors_dir, "relations", Settings().vectors) is None   # rules: through facts
    n_pairs = len(list(store.read_jsonl(p.synonyms_path)))
    assert n_pairs > 0 and len(pairs_in_graph(p)) == n_pairs
    manifest = p.manifest_path.read_bytes()
    res = runner.invoke(app, ["synonyms", "-p", str(proj), "-q", "--review", str(tmp_path / "r.tsv")])
    assert res.exit_code == 0, res.output
    assert p.manifest_path.read_bytes() == manifest and len(pairs_in_graph(p)) == n_pairs
    assert len((tmp_path / "r.tsv").read_text().splitlines()) == n_pairs + 1
    res = runner.invoke(app, ["resolve", "-p", str(proj), "-q", "--json"])
    assert res.exit_code == 0, res.output
    assert len(pairs_in_graph(p)) == n_pairs                  # resolve rewrote the graph; synonyms re-ran
    res = runner.invoke(app, ["status", "-p", str(proj), "--json"])
    assert res.exit_code == 0, res.output
    assert '"idf_fitted_docs":21' in res.output and '"idf_refresh_due":false' in res.output


def test_bm25_and_chunk_index_follow_the_chunks(tmp_path: Path, stub) -> None:
    from hrag_cli.storage.bm25 import BM25Index

    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    s = settings_for(stub)
    first = run(p, s)
    assert first.counts["bm25_chunks"] == 2 and first.counts["bm25_added"] == 2
    bm = BM25Index.load(p.vectors_dir / "bm25")
    assert sorted(bm.doc_ids()) == ["c1", "c2"] and bm.top_k("Tokyo", 1)[0][0] == "c2"
    # c2 replaced by c3 (a chunk id is a hash of its text, so an edit is a removal plus an addition)
    store.write_jsonl(p.chunks_path, [to_dict(Chunk("c1", "d1", 0, 6, "New York City and London are big.")),
                                      to_dict(Chunk("c3", "d1", 1, 4, "Kyoto is old."))])
    again = run(p, s)
    assert (again.counts["bm25_added"], again.counts["bm25_removed"]) == (1, 1)
    assert sorted(BM25Index.load(p.vectors_dir / "bm25").doc_ids()) == ["c1", "c3"]
    chunks = VectorIndex.load(p.vectors_dir, "chunks", s.vectors)
    assert chunks is not None and sorted(chunks.ids) == ["c1", "c3"]
    assert again.counts["embedded_now"] == 1                 # only the new chunk's text


def test_damaged_decision_lines_are_skipped(tmp_path: Path, stub) -> None:
    stub.set_embed(embed_fn)
    p = make_project(tmp_path, list(NAMES))
    (p.graph_dir / DECISIONS_FILE).write_text(
        '{"a": "greater london", "b": "london", "action": "skip", "similarity": null}\n'
        '{"a": "paris"}\n[1, 2]\n{"a": "paris", "b": "tokyo", "action": "maybe"}\n')
    run(p, settings_for(stub))
    got = pairs_in_file(p)
    assert set(got) == {AB, AC, BC}   # the valid skip applied, the broken lines ignored


def test_folded_name_search_keeps_the_exact_pairs() -> None:
    """Builtin name vectors are sparse: the neighbour search runs on them folded to 256 columns, then the lists
    are re-scored at full width. The pairs at or above the threshold, and their cosines, match the full-width
    search."""
    import numpy as np

    from hrag_cli.embed.embedder import BuiltinBackend, Embedder
    from hrag_cli.core.config import VectorSettings
    from hrag_cli.embed.knn import KnnLists, update_knn
    from hrag_cli.embed.synonym_edges import candidate_pairs, fold, rescore

    stems = ["Port Ellery", "Harrowgate Institute", "Corvane Works", "Tessaly River", "Marisol Venkat",
             "Bank of Ellery", "Sankt Orrin", "Kestrel Island", "Ruth Calloway", "Zoë Almqvist"]
    names = [f"{s}{suffix}" for s in stems for suffix in ("", "s", " Company", " (film)", " II", " Museum",
                                                            " Bridge", " of Miravel", " Street", " Road")]
    names += [f"Name{i} Person{i * 7 % 13}" for i in range(200)]
    emb = Embedder(BuiltinBackend(None), None)
    ids, hashes = [f"e{i}" for i in range(len(names))], [str(i) for i in range(len(names))]
    full = VectorIndex.build("names", ids, emb.encode(names), VectorSettings(), "m", hashes).rows()
    folded = fold(full)
    assert folded is not None and folded.shape == (len(names), 256)
    knn, _ = update_knn(KnnLists(10, "m"), ids, hashes, folded, 10, QUIET, 10, 1250)
    rescore(knn, full)
    stored = full.dense(np.arange(len(names)))                # the float16 values the index keeps
    listed = knn.nbr >= 0
    rows = np.repeat(np.arange(len(names)), 10).reshape(-1, 10)
    want_sims = (stored[rows[listed]] * stored[knn.nbr[listed]]).sum(1)
    assert listed.sum() > len(names) and np.allclose(knn.sim[listed], want_sims, atol=1e-5)
    assert (np.diff(knn.sim, axis=1) <= 1e-7).all()           # re-ordered best first
    dense = emb.encode(names)
    exact, _ = update_knn(KnnLists(10, "m"), ids, hashes, dense, 10, QUIET, 10, 1250)
    ok = set(ids).__contains__
    got, want = candidate_pairs(knn, ok, 0.8), candidate_pairs(exact, ok, 0.8)
    assert want and set(got) == set(want)
    assert np.allclose([got[k] for k in want], [want[k] for k in want], atol=2e-3)


def test_rescoring_only_the_joined_slots_gives_the_lists_of_rescoring_every_changed_row() -> None:
    """A later pass offers new entities to kept lists: `rescore` then computes the cosines of the slots the join
    filled (`KnnLists.joined`) and keeps the others, which an earlier rescore made exact. The lists come out
    as re-scoring every slot of every changed row gives them, bit for bit (names of punctuation alone, whose
    vectors are dense fallbacks, included)."""
    import copy

    import numpy as np

    from hrag_cli.core.config import VectorSettings
    from hrag_cli.embed.embedder import BuiltinBackend, Embedder
    from hrag_cli.embed.knn import KnnLists, update_knn
    from hrag_cli.embed.synonym_edges import fold, rescore

    stems = ["Port Ellery", "Harrowgate Institute", "Corvane Works", "Tessaly River", "Marisol Venkat"]
    names = [f"{s}{x}" for s in stems for x in ("", "s", " Company", " II", " Museum", " Bridge", " Street")]
    names += [f"Name{i} Person{i * 7 % 13}" for i in range(160)] + ["1999", "2001", "$", "%", "&", "...", "!!!"]
    order = np.random.default_rng(2).permutation(len(names))
    names = [names[i] for i in order]
    emb = Embedder(BuiltinBackend(None), None)
    ids, hashes = [f"e{i:03d}" for i in range(len(names))], [str(i) for i in range(len(names))]
    full = VectorIndex.build("names", ids, emb.encode(names), VectorSettings(), "m", hashes).rows()
    old = [i for i in range(len(names)) if i % 9 != 4 and names[i] != "$"]    # a first pass without some
    first = VectorIndex.build("names", [ids[i] for i in old], emb.encode([names[i] for i in old]),
                              VectorSettings(), "m", [hashes[i] for i in old]).rows()
    prev, _ = update_knn(KnnLists(6, "m"), [ids[i] for i in old], [hashes[i] for i in old], fold(first), 6, QUIET,
                         3, 40, min_sim=0.5)
    rescore(prev, first)
    knn, queried = update_knn(prev, ids, hashes, fold(full), 6, QUIET, 3, 40, min_sim=0.5)
    offered = knn.joined.any(axis=1) & ~knn.joined.all(axis=1)
    heavy = np.flatnonzero(np.diff(full.indptr) > full.dim // 8)
    assert 0 < queried < len(names) and offered.sum() > 5 and len(heavy) == 5
    assert np.isin(knn.nbr[knn.joined.any(axis=1)], heavy).any()
    every = copy.deepcopy(knn)
    rescore(every, full, np.flatnonzero(knn.joined.any(axis=1)))
    rescore(knn, full, slots=knn.joined)
    assert np.array_equal(knn.nbr, every.nbr) and np.array_equal(knn.sim.view(np.int32), every.sim.view(np.int32))


def test_fold_is_the_plain_folded_and_normed_matrix_bit_for_bit() -> None:
    """`fold` sums in place in its output: the same float32 values as folding each row densely (column mod
    256), casting and dividing by np.linalg.norm, which the lists of earlier runs were computed from."""
    import numpy as np

    from hrag_cli.embed.indices import EMBED_BLOCK
    from hrag_cli.embed.synonym_edges import FOLD_DIM, fold
    from hrag_cli.storage.vectors.sparse import sparse_rows

    rng = np.random.default_rng(5)
    n, dim = EMBED_BLOCK + 300, 2048                        # two blocks, the second a short one
    m = np.zeros((n, dim), dtype=np.float32)
    for i in range(n):
        m[i, rng.choice(dim, size=int(rng.integers(0, 40)), replace=False)] = rng.standard_normal()
    m[7] = 0.0                                                # an empty row stays zero
    rows = sparse_rows(m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-9))
    dense = rows.dense(np.arange(n)).astype(np.float64)
    want = dense.reshape(n, dim // FOLD_DIM, FOLD_DIM).sum(axis=1).astype(np.float32)
    norms = np.linalg.norm(want, axis=1, keepdims=True)
    want = want / np.where(norms > 0, norms, 1)
    got = fold(rows)
    assert got is not None and got.dtype == np.float32 and not got[7].any()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_builtin_embedding_in_worker_processes_matches_one_process(monkeypatch) -> None:
    """The builtin embedder runs in one forked worker per core for a large job, handing back sparse rows: the
    same vectors, in the same order, as embedding in this process (float16 values)."""
    import numpy as np

    from hrag_cli.embed.embedder import BuiltinBackend, Embedder
    from hrag_cli.embed.indices import embed_blocks
    from hrag_cli.storage.vectors.sparse import SparseRows

    monkeypatch.setattr("os.cpu_count", lambda: 2)          # a one-core CI machine still takes the pool path
    texts = [f"Name{i} Person{i % 13} of Place{i % 7}" for i in range(700)]

    def batches():
        return (texts[i:i + 100] for i in range(0, len(texts), 100))

    one = Embedder(BuiltinBackend(None), None)
    serial = np.concatenate(list(embed_blocks(one, batches(), len(texts), QUIET, min_parallel=10 ** 9)))
    emb = Embedder(BuiltinBackend(None), None)
    blocks = list(embed_blocks(emb, batches(), len(texts), QUIET, min_parallel=1))
    assert len(blocks) == 7 and all(isinstance(b, SparseRows) for b in blocks)
    pooled = np.concatenate([b.dense(np.arange(len(b))) for b in blocks])
    assert pooled.shape == serial.shape and np.abs(pooled - serial).max() < 2e-3
    assert emb.stats["embedded"] == one.stats["embedded"] == len(texts)


def test_similarity_floor_is_a_rank_on_the_embedders_own_scale() -> None:
    from types import SimpleNamespace

    import numpy as np

    from hrag_cli.embed.synonym_edges import FLOOR_MIN_ENTITIES, names_only, similarity_floor

    n = 4 * FLOOR_MIN_ENTITIES
    rng = np.random.default_rng(7)
    for scale in (0.5, 0.9):          # two embedders: one spreads its cosines, one crowds them near 1
        best = 1.0 - (1.0 - scale) * rng.random(n)
        knn = SimpleNamespace(nbr=np.array([[(i + 1) % n, -1] for i in range(n)]),
                              sim=np.stack([best, np.zeros(n)], axis=1).astype(np.float32))
        linkable = np.ones(n, dtype=bool)
        floor = similarity_floor(knn, linkable, -1.0, 0.2)
        # the same share of entities has a neighbour at or above the floor, whatever the scale
        share = float((best >= floor).mean())
        assert 0.19 <= share <= 0.21, (scale, floor, share)
        assert similarity_floor(knn, linkable, 0.999, 0.2) == 0.999           # the threshold stays a bound
        assert similarity_floor(knn, linkable, -1.0, 0.0) == -1.0             # 0: the threshold alone
    small = SimpleNamespace(nbr=knn.nbr[:10] % 10, sim=knn.sim[:10])
    assert similarity_floor(small, np.ones(10, dtype=bool), 0.3, 0.2) == 0.3  # too few to rank

    keys = np.array([k.encode() for k in ("port ellery", "12 october 2025", "with", "10 million", "flask",
                                           "1987", "pcre2_compile", "but")])
    knn = SimpleNamespace(nbr=np.array([[(i + 1) % 8] for i in range(8)]), sim=np.full((8, 1), 0.99, np.float32),
                          keys=keys)
    ok = names_only(knn, np.ones(8, dtype=bool), 0.9)
    assert [k.decode() for k, y in zip(keys, ok) if y] == ["port ellery", "flask", "pcre2_compile"]

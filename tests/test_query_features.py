"""The query features beyond the modes: ppr's rank fusion and seed confidence, HippoRAG 2's fact filter,
LightRAG's chunk picking, the reranker stage, and --response-type / --user-prompt / --history with --answer.
Every model call goes through litellm to the stub server."""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hrag_cli.cli import app
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.query.index import QueryIndex
from hrag_cli.graph.chunk_prior import walk_scale
from hrag_cli.graph.push import personalized_pagerank
from hrag_cli.query.ppr import SeedWeights
from hrag_cli.query.recognition import parse_kept
from hrag_cli.query.rerank import split_for_rerank
from hrag_cli.query.retrieval import (
    chunk_pick_boost, fact_seed_weights, fuse_ranks, pick_by_vector, retrieve, rrf_scores, walk_share)
from hrag_cli.query.run import QuerySession, read_history
from tests.stub_server import RERANK

Q = "In which village was the founder of the company that built Port Ellery's sea wall born?"


def _settings(project: ProjectDir, llm: dict | None = None, **query: object):
    """The project's settings with these query settings. The walk's features are tested on Q, whose Port Ellery
    is in 11 of the sample's 20 chunks: so the common-name rule and the per-document cap are off unless asked."""
    s = project.settings()
    query = {"common_name_share": 0.0, "doc_cap": 0, **query}
    s = replace(s, query=replace(s.query, **query))
    if llm:
        s = replace(s, llm=replace(s.llm, **llm))
    return s


def _copy(sample_project: Path, tmp_path: Path) -> ProjectDir:
    root = tmp_path / "p"
    shutil.copytree(sample_project, root)     # the LLM cache is written into the project
    return ProjectDir(root)


def _hrag(*args: str, code: int = 0) -> str:
    """stdout of a run that should succeed, or the error text of one that should fail with `code` (2: usage;
    app() raises our UsageError, which main() turns into exit code 2)."""
    result = CliRunner().invoke(app, list(args))
    if code == 0:
        assert result.exit_code == 0, result.output
        return result.stdout
    err = result.exception
    assert result.exit_code == code or (isinstance(err, UsageError) and err.exit_code == code), result.output
    return result.output + str(err or "")


# -- ppr: rank fusion and seed confidence ---------------------------------------------------------------------

def test_fuse_ranks_head_from_the_fusion_rest_from_the_walk(sample_project: Path) -> None:
    s = replace(ProjectDir(sample_project).settings().query, fusion_head=2, fusion_k=1.0, fusion_lexical=0.5)
    walk = np.array([0.9, 0.1, 0.8, 0.0, 0.7, 0.6])
    passage = np.array([0.0, 0.8, 0.85, 0.9, 0.1, 0.2])
    lexical = np.array([0.0, 5.0, 0.0, 0.0, 0.0, 0.0])
    assert fuse_ranks(walk, passage, lexical, 1.0, s) is walk
    order = list(np.argsort(-fuse_ranks(walk, passage, lexical, 0.5, s), kind="stable"))
    # head: chunk 0 (walk's first) and chunk 1 (BM25's first, passage's third); then the walk's order
    assert sorted(order[:2]) == [0, 1] and order[2:] == [2, 4, 5, 3]
    # all on the passage side: the head is the passage ranking's best, the rest still follows the walk
    order = list(np.argsort(-fuse_ranks(walk, passage, None, 0.0, s), kind="stable"))
    assert order[:2] == [3, 2] and order[2:] == [0, 4, 5, 1]
    assert rrf_scores(np.array([0.2, 0.9]), 0).tolist() == [0.5, 1.0]


def test_fused_head_is_the_head_of_ranking_every_chunk(sample_project: Path) -> None:
    """The head found from the best of each list is the head of the fusion over every chunk's rank (ties to
    the lower index), on lists with many ties, chunks the graph lacks (-1) and BM25 matching a few."""
    base = ProjectDir(sample_project).settings().query
    rng = np.random.default_rng(4)
    for t in range(60):
        n = int(rng.integers(2, 5000))
        walk, passage = rng.random(n) ** 6, rng.random(n)
        lexical = rng.random(n) * (rng.random(n) < 0.2) if t % 4 else None
        if t % 3 == 0:
            walk, passage = np.round(walk, 2), np.where(rng.random(n) < 0.7, 0.0, np.round(passage, 2))
        walk[rng.random(n) < 0.1] = -1.0
        s = replace(base, fusion_head=int(rng.choice([1, 2, 5, 50])), fusion_k=float(rng.choice([1.0, 60.0])))
        w = float(rng.choice([0.0, 0.4, 0.9]))
        lw = s.fusion_lexical if lexical is not None else 0.0
        rest = (1.0 - lw) * rrf_scores(passage, s.fusion_k)
        if lw > 0:
            rest = rest + lw * np.where(lexical > 0, rrf_scores(lexical, s.fusion_k), 0.0)
        fused = w * rrf_scores(walk, s.fusion_k) + (1.0 - w) * rest
        head = np.argsort(-fused, kind="stable")[: s.fusion_head]
        got = fuse_ranks(walk, passage, lexical, w, s)
        assert np.argsort(-got, kind="stable")[: len(head)].tolist() == head.tolist()


def test_walk_share_by_graph_and_seed_strength(sample_project: Path) -> None:
    s = replace(ProjectDir(sample_project).settings().query, walk_weight=0.9, rules_walk_weight=0.6,
                seed_confidence=0.5, rules_unnamed_walk_weight=1.0)
    seeds = SeedWeights({1: 0.3}, {1: ["f1"]})
    assert walk_share(s, False, seeds, [0.5, 0.2]) == pytest.approx(0.9)
    assert walk_share(s, True, seeds, [0.5, 0.2]) == pytest.approx(0.6)
    assert walk_share(s, True, seeds, [0.25]) == pytest.approx(0.3)
    assert walk_share(s, True, seeds, []) == 0.0
    named = SeedWeights({1: 0.3}, {1: ["name in query"]})
    assert walk_share(s, True, named, [0.1]) == pytest.approx(0.6)    # a name from the query is a strong seed
    assert walk_share(replace(s, seed_confidence=0.0), True, seeds, []) == pytest.approx(0.6)
    # a rules graph's fact seeds alone (no name from the query): at most rules_unnamed_walk_weight
    s = replace(s, seed_confidence=0.0, rules_unnamed_walk_weight=0.2)
    assert walk_share(s, True, seeds, [0.9]) == pytest.approx(0.2)
    assert walk_share(s, True, named, [0.9]) == pytest.approx(0.6)
    assert walk_share(s, False, seeds, [0.9]) == pytest.approx(0.9)     # OpenIE/LLM graphs: facts are real


def test_fact_seed_weights_favour_the_best_match() -> None:
    assert fact_seed_weights([0.8, 0.4, -0.1], 2.0) == pytest.approx([0.8, 0.4 * 0.25, 0.0])
    assert fact_seed_weights([0.8, 0.4, -0.1], 0.0) == pytest.approx([0.8, 0.4, 0.0])    # 0: the raw scores
    assert fact_seed_weights([], 2.0) == [] and fact_seed_weights([-0.2], 2.0) == [0.0]


def test_fact_seed_sharpness_reaches_the_seeds(sample_project: Path) -> None:
    project = ProjectDir(sample_project)
    ix = QueryIndex(project, project.settings())
    raw = retrieve(ix, Q, _settings(project, fact_seed_sharpness=0.0, entity_name_seeds=False), mode="ppr")
    sharp = retrieve(ix, Q, _settings(project, fact_seed_sharpness=2.0, entity_name_seeds=False), mode="ppr")
    facts = {f["id"]: f["score"] for f in raw.facts}
    assert facts == {f["id"]: f["score"] for f in sharp.facts}     # the facts and their shown scores stay
    best = max(facts.values())
    before = {e["id"]: e for e in raw.entities}
    ratios = []
    for e in sharp.entities:     # an entity seeded by one fact: its seed shrinks by (score / best) ** 2
        if len(e["seeded_by"]) == 1 and before[e["id"]]["score"] > 1e-3:
            want = (facts[e["seeded_by"][0]] / best) ** 2
            ratios.append((e["score"] / before[e["id"]]["score"], want))
    assert ratios and any(want < 0.99 for _, want in ratios)        # some seed came from a weaker fact
    for got, want in ratios:
        assert got == pytest.approx(want, rel=0.01)


def test_ppr_head_fusion_on_a_rules_graph(sample_project: Path) -> None:
    project = ProjectDir(sample_project)
    ix = QueryIndex(project, project.settings())
    assert ix.extractor.startswith("rules")
    walk_only = retrieve(ix, Q, _settings(project, rules_walk_weight=1.0), mode="ppr")
    fused = retrieve(ix, Q, _settings(project, rules_walk_weight=0.0, fusion_lexical=0.0), mode="ppr")
    naive = retrieve(ix, Q, _settings(project), mode="naive")
    # no walk share: the first ranks are the passage ranking's, the rest the walk's order without them
    assert [c.chunk_id for c in fused.chunks[:2]] == [c.chunk_id for c in naive.chunks[:2]]
    head = {c.chunk_id for c in fused.chunks[:2]}
    rest = [c.chunk_id for c in walk_only.chunks if c.chunk_id not in head]
    assert [c.chunk_id for c in fused.chunks[2:]] == rest[:len(fused.chunks) - 2]
    assert fused.facts and fused.entities                   # the walk still ran and says what seeded it


def test_rules_graph_walk_without_synonym_edges(sample_project: Path) -> None:
    from hrag_cli.graph.model import EDGE_KINDS, load_graph
    from hrag_cli.graph.model import walk_arrays
    from hrag_cli.graph.walk import WalkGraph

    project = ProjectDir(sample_project)
    ix = QueryIndex(project, project.settings())
    walk, syn = ix.walk, ix.walk.kind == EDGE_KINDS.index("SYNONYM")
    assert ix.extractor.startswith("rules") and syn.any()
    assert walk_scale(True, 1.0) is None and walk_scale(False, 0.0) is None     # as built
    # weight 0 walks exactly as if the SYNONYM edges were not there; weight 2 doubles them
    bare = load_graph(project)[0]
    bare.delete_edges(bare.es.select(kind_eq="SYNONYM"))
    reset = np.zeros(walk.vcount())
    reset[sorted(walk.keys_of_kind("entity").values())[:5]] = 1.0
    np.testing.assert_allclose(personalized_pagerank(walk, reset, 0.5, walk_scale(True, 0.0)),
                               personalized_pagerank(WalkGraph(walk_arrays(bare)), reset, 0.5), atol=1e-12)
    doubled = walk.weights(walk_scale(True, 2.0))
    assert (doubled[syn] == 2 * walk.weight[syn]).all() and (doubled[~syn] == walk.weight[~syn]).all()
    # the setting reaches the walk: with the synonym edges doubled the ranking's scores change
    on = retrieve(ix, Q, _settings(project, rules_synonym_weight=2.0, rules_walk_weight=1.0), mode="ppr")
    off = retrieve(ix, Q, _settings(project, rules_synonym_weight=0.0, rules_walk_weight=1.0), mode="ppr")
    assert [c.score for c in on.chunks] != [c.score for c in off.chunks]


def test_rules_facts_seed_when_they_touch_a_named_entity(sample_project: Path) -> None:
    from hrag_cli.query.retrieval import _fact_ends

    project = ProjectDir(sample_project)
    ix = QueryIndex(project, project.settings())
    assert ix.extractor.startswith("rules")

    def touching(r, named: set[str]) -> list[bool]:
        return [bool(named.intersection(_fact_ends(ix, ix.facts.get(f["id"])))) for f in r.facts]

    anchored = retrieve(ix, Q, _settings(project), mode="ppr")
    loose = retrieve(ix, Q, _settings(project, rules_anchor_fact_top_k=0), mode="ppr")
    named = {e["id"] for e in anchored.entities if "name in query" in e["seeded_by"]}
    assert named == {"port ellery"}
    assert anchored.facts and all(touching(anchored, named))
    assert not all(touching(loose, named)) and len(loose.facts) == project.settings().query.fact_top_k
    # it looks past the best fact_top_k facts for the named entity's own
    assert {f["id"] for f in anchored.facts} - {f["id"] for f in loose.facts}
    # a name most chunks mention names nothing: the facts are the best fact_top_k, as without anchoring
    common = retrieve(ix, Q, _settings(project, common_name_share=0.05), mode="ppr")
    assert [f["id"] for f in common.facts] == [f["id"] for f in loose.facts]
    # a graph from an LLM or imported OpenIE: its facts are relations, every one of the best seeds
    ix.__dict__["extractor"] = "openie:test"
    other = retrieve(ix, Q, _settings(project), mode="ppr")
    assert [f["id"] for f in other.facts] == [f["id"] for f in loose.facts]


def test_seed_walk_is_the_walk_of_the_seeds_alone(sample_project: Path) -> None:
    from hrag_cli.query.ppr import seed_walk

    project = ProjectDir(sample_project)
    walk = QueryIndex(project, project.settings()).walk
    vs = sorted(walk.keys_of_kind("entity").values())[:3]
    seeds = SeedWeights({vs[2]: 0.5, vs[0]: 2.0, vs[1]: 1.0})
    reset = np.zeros(walk.vcount())
    reset[vs] = [2.0, 1.0, 0.5]
    whole = personalized_pagerank(walk, reset, 0.5)
    np.testing.assert_allclose(seed_walk(walk, seeds, 0.5), whole, rtol=1e-3, atol=1e-6)   # push: to PUSH_EPS
    chunks = np.array(sorted(walk.keys_of_kind("chunk").values()))
    np.testing.assert_allclose(seed_walk(walk, seeds, 0.5, vertices=chunks), whole[chunks], rtol=1e-3, atol=1e-6)


def test_fuse_ranks_head_from_the_seed_walk_then_the_whole_walk(sample_project: Path) -> None:
    s = replace(ProjectDir(sample_project).settings().query, fusion_head=2, fusion_k=1.0, fusion_lexical=0.0)
    walk = np.array([0.9, 0.8, 0.1, 0.0, 0.7, 0.6])
    alone = np.array([0.9, 0.0, 0.8, 0.1, 0.2, 0.3])
    passage = np.array([0.5, 0.4, 0.45, 0.0, 0.1, 0.2])
    plain = np.argsort(-fuse_ranks(walk, passage, None, 0.5, s), kind="stable")
    assert plain[:2].tolist() == [0, 1]
    fused = np.argsort(-fuse_ranks(walk, passage, None, 0.5, s, alone), kind="stable")
    # the seed walk's head (0, 2), then the whole walk's head chunk it lacks (1), then the walk's order
    assert fused.tolist() == [0, 2, 1, 4, 5, 3]


def test_a_name_in_one_chunk_heads_the_ranking_by_the_seed_walk(sample_project: Path, monkeypatch) -> None:
    import hrag_cli.query.retrieval as retrieval

    project = ProjectDir(sample_project)
    ix = QueryIndex(project, project.settings())
    q = "Where was Colm Farrant born?"
    assert [ix.entity_chunk_counts.get(e) for e in retrieval.name_seeds(ix, q)] == [1]
    calls = []
    real = retrieval.seed_walk
    monkeypatch.setattr(retrieval, "seed_walk", lambda *a, **k: calls.append(1) or real(*a, **k))
    on = retrieve(ix, q, _settings(project), mode="ppr")
    assert calls == [1]
    off = retrieve(ix, q, _settings(project, head_seed_chunks=0), mode="ppr")
    assert calls == [1]                     # 0: the whole walk heads the ranking, no second walk
    assert {c.chunk_id for c in on.chunks} and len(on.chunks) == len(off.chunks)
    retrieve(ix, Q, _settings(project), mode="ppr")     # Port Ellery: in 11 chunks
    assert calls == [1]


# -- HippoRAG 2 recognition memory -----------------------------------------------------------------------------

def test_parse_kept() -> None:
    assert parse_kept('```json\n{"relevant": [2, "1", 2, 9, true]}\n```', 3) == [1, 0]
    assert parse_kept('{"relevant": []}', 3) == []
    assert parse_kept("no idea", 3) is None
    assert parse_kept('{"other": 1}', 3) is None


def test_fact_filter_one_cached_call_per_query(sample_project: Path, tmp_path: Path, stub) -> None:
    project = _copy(sample_project, tmp_path)
    seen: list[str] = []

    def chat(body: dict) -> str:
        text = body["messages"][-1]["content"]
        seen.append(text)
        assert "Candidate facts:" in text and Q in text
        return '{"relevant": [2]}'

    stub.set_chat(chat)
    s = _settings(project, llm={"model": "openai/stub", "api_base": stub.url, "max_retries": 0})
    unfiltered = retrieve(QueryIndex(project, s), Q, _settings(project, fact_filter="off"), mode="ppr")
    session = QuerySession(project, s)
    try:
        r, _ = session.run(Q, mode="ppr")
        assert stub.count() == 1
        assert [f["id"] for f in r.facts] == [unfiltered.facts[1]["id"]]
        assert any("fact filter kept 1 of" in n for n in r.notes)
        session.run(Q, mode="ppr")
        assert stub.count() == 1                        # the same question: answered from the cache
    finally:
        session.close()
    # a second process reads the cache from disk too
    QuerySession(project, s).run(Q, mode="ppr")
    assert stub.count() == 1 and len(seen) == 1


def test_fact_filter_settings(sample_project: Path, tmp_path: Path, stub) -> None:
    project = _copy(sample_project, tmp_path)
    ix = QueryIndex(project, project.settings())
    with pytest.raises(UsageError, match="needs an LLM"):
        retrieve(ix, Q, _settings(project, fact_filter="on"), mode="ppr")
    with pytest.raises(UsageError, match="auto, on or off"):
        retrieve(ix, Q, _settings(project, fact_filter="maybe"), mode="ppr")
    # checked with the other settings, not only when facts were found to filter, and in every mode
    with pytest.raises(UsageError, match="needs an LLM"):
        retrieve(ix, Q, _settings(project, fact_filter="on", fact_top_k=0), mode="ppr")
    for mode in ("ppr", "naive", "bm25"):
        with pytest.raises(UsageError, match="auto, on or off"):
            retrieve(ix, Q, _settings(project, fact_filter="maybe", fact_top_k=0), mode=mode)
    # without an LLM, auto is off: no call, no note
    r = retrieve(ix, Q, _settings(project), mode="ppr")
    assert r.facts and not any("fact filter" in n for n in r.notes)
    # an unreadable reply keeps every fact, with a note
    stub.set_chat(lambda body: "I think the second one")
    s = _settings(project, llm={"model": "openai/stub", "api_base": stub.url, "max_retries": 0})
    r2, _ = QuerySession(project, s).run(Q, mode="ppr")
    assert [f["id"] for f in r2.facts] == [f["id"] for f in r.facts]
    assert any("could not be parsed" in n for n in r2.notes)
    # off: no call at all
    n = stub.count()
    QuerySession(project, _settings(project, llm={"model": "openai/stub", "api_base": stub.url},
                                    fact_filter="off")).run(Q, mode="ppr")
    assert stub.count() == n


# -- LightRAG chunk picking ------------------------------------------------------------------------------------

def test_chunk_pick_vector_and_weight(sample_project: Path) -> None:
    project = ProjectDir(sample_project)
    ix = QueryIndex(project, project.settings())
    kw = {"high": [Q], "low": [Q]}
    assert project.settings().embed.model == "builtin"       # so builtin_chunk_pick_boost is the one used

    def local(**query: object):
        return retrieve(ix, Q, _settings(project, top_k=20, chunk_top_k=6, **query), mode="local", keywords=kw)

    vec = local(chunk_pick="vector", builtin_chunk_pick_boost=0.0, chunk_pick_boost=5.0)
    boosted = local(chunk_pick="vector", builtin_chunk_pick_boost=1.0, chunk_pick_boost=0.0)
    wt = local(chunk_pick="weight")
    naive = retrieve(ix, Q, _settings(project, top_k=50), mode="naive").chunks
    passage = {c.chunk_id: c.score for c in naive}
    # vector, no boost: the naive ranking itself (the most similar chunks are candidates beside the graph's)
    assert [c.chunk_id for c in vec.chunks] == [c.chunk_id for c in naive[:6]]
    assert all(abs(passage[c.chunk_id] - c.score) < 1e-9 for c in vec.chunks)
    # boosted: the graph's chunks move up by the share of chosen items carrying them, never down
    bs = [c.score for c in boosted.chunks]
    assert bs == sorted(bs, reverse=True) and len(bs) == 6
    assert all(c.score >= passage.get(c.chunk_id, 0.0) - 1e-9 for c in boosted.chunks)
    assert any(c.score > passage.get(c.chunk_id, 0.0) + 1e-9 for c in boosted.chunks)
    assert [c.chunk_id for c in boosted.chunks] != [c.chunk_id for c in vec.chunks]
    # weight: only chunks the chosen entities/relations carry, by how many carry them
    ws = [c.score for c in wt.chunks]
    assert ws == sorted(ws, reverse=True) and all(float(x).is_integer() and x >= 1 for x in ws)
    few = retrieve(ix, Q, _settings(project, chunk_top_k=2, top_k=5), mode="hybrid", keywords=kw)
    assert len(few.chunks) == 2                          # vector: one pick of two from both sides' items
    few = retrieve(ix, Q, _settings(project, chunk_pick="weight", chunk_top_k=2, top_k=5), mode="hybrid",
                   keywords=kw)
    assert 2 <= len(few.chunks) <= 4                     # weight: two from local, two from global, interleaved
    with pytest.raises(UsageError, match="chunk_pick"):
        retrieve(ix, Q, _settings(project, chunk_pick="random"), mode="local", keywords=kw)


def test_chunk_pick_boost_by_embedder(sample_project: Path) -> None:
    s = ProjectDir(sample_project).settings()
    s = replace(s, query=replace(s.query, chunk_pick_boost=0.1, builtin_chunk_pick_boost=1.0))
    assert chunk_pick_boost(s) == 1.0
    assert chunk_pick_boost(replace(s, embed=replace(s.embed, model="st:/models/minilm"))) == 0.1
    assert chunk_pick_boost(replace(s, embed=replace(s.embed, model="openai/text-embedding-3-small"))) == 0.1


def test_vector_pick_votes_by_match(sample_project: Path) -> None:
    """Hybrid's pick: an item votes with its score against the query, so one well-matching item outweighs two
    loose ones, and an item scoring 0 or below only adds its chunks as candidates; local and global count."""
    project = ProjectDir(sample_project)
    ix = QueryIndex(project, project.settings())
    a, b, c, d = ix.chunk_ids[:4]
    pick = pick_by_vector(ix, np.zeros(len(ix.chunk_ids)), boost=1.0, by_match=True)
    got = pick([([a], 0.9), ([b], 0.2), ([b, b], 0.2), ([c], -0.5), ([c, d], 0.0)], 4)
    assert [x.chunk_id for x in got] == [a, b, c, d]
    assert [x.score for x in got] == pytest.approx([0.9 / 1.3, 0.4 / 1.3, 0.0, 0.0])
    assert [x.score for x in pick([([a], 0.0)], 1)] == [0.0]     # no vote at all: similarity alone
    count = pick_by_vector(ix, np.zeros(len(ix.chunk_ids)), boost=1.0)([([a], 0.9), ([b], 0.2), ([b], 0.2)], 2)
    assert [(x.chunk_id, x.score) for x in count] == [(b, pytest.approx(2 / 3)), (a, pytest.approx(1 / 3))]


# -- reranker --------------------------------------------------------------------------------------------------

def test_split_for_rerank() -> None:
    assert split_for_rerank("short text", 100) == ["short text"]
    long = " ".join(f"word{i}." for i in range(400))
    pieces = split_for_rerank(long, 64)
    assert len(pieces) > 3 and pieces[0].startswith("word0.") and "word399." in pieces[-1]


def test_rerank_through_litellm_and_the_stub(sample_project: Path, tmp_path: Path, stub) -> None:
    project = _copy(sample_project, tmp_path)
    marker = "Gullhaven"

    def score(body: dict) -> list[float]:
        # only a piece holding the marker scores; the chunk must get that piece's score (max over pieces)
        return [1.0 if marker in d else 0.0 for d in body["documents"]]

    stub.set_rerank(score)
    s = _settings(project, rerank="hosted_vllm/stub-reranker", rerank_api_base=stub.url, rerank_chunk_tokens=24,
                  top_k=5)
    session = QuerySession(project, s)
    try:
        r, _ = session.run(Q, mode="naive")
        assert stub.count(RERANK) == 1 and "rerank_ms" in r.timings
        assert marker in r.chunks[0].text and r.chunks[0].score == 1.0
        first = stub.requests[0][1]
        assert first["query"] == Q and first["model"] == "stub-reranker"
        assert len(first["documents"]) > 5                # long chunks went out in pieces
        flags = [marker in c.text for c in r.chunks]
        assert flags == sorted(flags, reverse=True)      # every marker chunk ahead of the rest
        session.run(Q, mode="naive")
        assert stub.count(RERANK) == 1                   # cached per (query, piece)
    finally:
        session.close()


def test_rerank_flag_in_cli(sample_project: Path, tmp_path: Path, stub) -> None:
    project = _copy(sample_project, tmp_path)
    out = _hrag("query", Q, "-p", str(project.root), "--json", "-m", "bm25", "--rerank", "hosted_vllm/rr",
                "--set", f"query.rerank_api_base={stub.url}")
    obj = json.loads(out)
    assert stub.count(RERANK) == 1 and "rerank_ms" in obj["timings"]
    _hrag("eval", str(Path(__file__).parent / "fixtures" / "sample_questions.jsonl"), "-p", str(project.root),
          "--modes", "naive", "--rerank", "hosted_vllm/rr", "--set", f"query.rerank_api_base={stub.url}", "--json")
    assert stub.count(RERANK) >= 2


def test_st_reranker_without_the_extra(sample_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec       # as a machine without hrag[local] answers
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentence_transformers" else real(name, *a))
    project = ProjectDir(sample_project)
    with pytest.raises(UsageError, match="install hrag\\[local\\]"):
        QuerySession(project, _settings(project, rerank="st:/nowhere")).run(Q, mode="naive")


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs hrag[local]")
def test_st_reranker_missing_folder(sample_project: Path) -> None:
    project = ProjectDir(sample_project)
    with pytest.raises(UsageError, match="folder not found"):
        QuerySession(project, _settings(project, rerank="st:/nowhere/at/all")).run(Q, mode="naive")


# -- answer options --------------------------------------------------------------------------------------------

def test_answer_with_response_type_user_prompt_and_history(sample_project: Path, tmp_path: Path, stub) -> None:
    project = _copy(sample_project, tmp_path)
    bodies: list[dict] = []

    def chat(body: dict) -> str:
        bodies.append(body)
        return "Gullhaven [1]."

    stub.set_chat(chat)
    hist = tmp_path / "history.json"
    hist.write_text(json.dumps([{"role": "user", "content": "Who built the sea wall?"},
                                {"role": "assistant", "content": "Corvane Works [1]."}]))
    out = _hrag("query", Q, "-p", str(project.root), "-m", "naive", "--json", "--answer",
                "--llm-model", "openai/stub", "--llm-api-base", stub.url, "--response-type", "one short sentence",
                "--user-prompt", "Answer in the voice of a harbour master.", "--history", str(hist))
    assert json.loads(out)["answer"] == "Gullhaven [1]."
    msgs = bodies[-1]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert "one short sentence" in msgs[0]["content"] and "harbour master" in msgs[0]["content"]
    assert msgs[1]["content"] == "Who built the sea wall?" and Q in msgs[3]["content"]


def test_answer_options_need_answer_and_a_valid_history(sample_project: Path, tmp_path: Path) -> None:
    r = _hrag("query", Q, "-p", str(sample_project), "--response-type", "bullets", code=2)
    assert "add --answer" in r
    bad = tmp_path / "h.jsonl"
    bad.write_text('{"role": "system", "content": "x"}\n')
    with pytest.raises(UsageError, match="turn 1"):
        read_history(bad)
    bad.write_text("not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        read_history(bad)
    good = tmp_path / "g.jsonl"
    good.write_text('{"role": "user", "content": "hi"}\n\n{"role": "assistant", "content": "hello"}\n')
    assert [t["role"] for t in read_history(good)] == ["user", "assistant"]


def test_set_accepts_only_query_settings(sample_project: Path) -> None:
    r = _hrag("query", Q, "-p", str(sample_project), "--set", "embed.model=builtin", code=2)
    assert "query.NAME=VALUE" in r
    r = _hrag("query", Q, "-p", str(sample_project), "--set", "query.nope=1", code=2)
    assert "unknown setting" in r

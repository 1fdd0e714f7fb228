"""Relation vectors (`vectors.relations`): embedded only when relations say more than their facts; otherwise
global mode ranks relations through the fact vectors; switching the setting rebuilds the stage cleanly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrag_cli.core import store
from hrag_cli.cli import app
from hrag_cli.core.config import Settings, load_settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.query.index import QueryIndex
from hrag_cli.query.retrieval import relation_hits, retrieve
from hrag_cli.embed.texts import relation_vectors

Q = "Who built the sea wall of Port Ellery?"


def test_auto_embeds_relations_only_for_an_llm_extractor() -> None:
    s = Settings()
    assert relation_vectors(s, "llm:openai/gpt-4o-mini:1a2b")
    assert not any(relation_vectors(s, x) for x in ("rules-v2", "openie:3c4d", ""))
    s.vectors.relations = "on"
    assert relation_vectors(s, "rules-v2")
    s.vectors.relations = " OFF "
    assert not relation_vectors(s, "llm:openai/gpt-4o-mini:1a2b")


def test_a_bad_value_is_a_usage_error_before_anything_is_written(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    (root / "hrag.toml").write_text('[vectors]\nrelations = "sometimes"\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"vectors\.relations: 'sometimes' must be one of auto, on, off"):
        load_settings(root / "hrag.toml")
    res = CliRunner().invoke(app, ["index", str(Path(__file__).parent.parent / "sample_corpus"), "-p", str(root)])
    assert isinstance(res.exception, UsageError) and "vectors.relations" in str(res.exception)   # main(): exit 2
    assert sorted(x.name for x in root.iterdir()) == ["hrag.toml"]


def _best_fact_scores(ix: QueryIndex, qvec) -> dict[str, float]:
    """Every fact scored exactly; a relation's score is its best fact's."""
    facts = ix.vector_index("facts")
    best: dict[str, float] = {}
    for fid, sc in zip(facts.ids, facts.scores(qvec).tolist()):
        rid = ix.facts[fid].relation_id
        best[rid] = max(best.get(rid, -1.0), sc)
    return best


def _best_fact_ranking(ix: QueryIndex, qvec, k: int) -> list[tuple[str, float]]:
    return sorted(_best_fact_scores(ix, qvec).items(), key=lambda kv: -kv[1])[:k]


def test_global_ranks_rules_relations_by_their_best_fact(sample_project: Path) -> None:
    p = ProjectDir(sample_project)
    ix = QueryIndex(p, p.settings())
    assert ix.vector_index("relations") is None and p.stage("synonyms").counts["relation_vectors"] == "off"
    qvec = ix.embed_query(Q)
    hits = relation_hits(ix, qvec, 5)
    want = _best_fact_ranking(ix, qvec, 5)
    assert len(hits) == 5
    assert [sc for _, sc in hits] == pytest.approx([sc for _, sc in want], abs=1e-4)
    best = _best_fact_scores(ix, qvec)
    assert all(best[rid] == pytest.approx(sc, abs=1e-4) for rid, sc in hits)    # each scores as its best fact
    r = retrieve(ix, Q, p.settings(), mode="global")
    assert [x["id"] for x in r.relations][:5] == [rid for rid, _ in hits] and r.chunks and r.entities


def _index(root: Path, relations: str) -> dict:
    (root / "hrag.toml").write_text(f'[vectors]\nrelations = "{relations}"\n', encoding="utf-8")
    res = CliRunner().invoke(app, ["index", "-p", str(root), "-q", "--json"])
    assert res.exit_code == 0, res.output
    return ProjectDir(root).stage("synonyms").counts


def test_switching_relation_vectors_on_and_off(sample_project: Path, tmp_path: Path) -> None:
    root = tmp_path / "p"
    shutil.copytree(sample_project, root, symlinks=True)
    p = ProjectDir(root)
    n_relations = sum(1 for _ in store.read_jsonl(p.relations_path))

    counts = _index(root, "on")                   # a changed setting re-runs the stage: relations embedded
    assert counts["relation_vectors"] == "on" and counts["vectors_relations"] == n_relations
    p = ProjectDir(root)                             # the run switched generations
    ix = QueryIndex(p, p.settings())
    qvec = ix.embed_query(Q)
    assert len(ix.vector_index("relations")) == n_relations
    assert relation_hits(ix, qvec, 5) == ix.search("relations", qvec, 5)      # its own vectors are used
    assert retrieve(ix, Q, p.settings(), mode="global").relations

    counts = _index(root, "off")                  # and switched off, the old index goes: never read stale
    assert counts["relation_vectors"] == "off" and "vectors_relations" not in counts
    p = ProjectDir(root)
    assert not list(p.vectors_dir.glob("relations.*"))
    res = CliRunner().invoke(app, ["status", "-p", str(root), "--verify"])
    assert res.exit_code == 0, res.output
    ix = QueryIndex(p, p.settings())
    assert ix.vector_index("relations") is None
    assert [rid for rid, _ in relation_hits(ix, qvec, 5)] == [rid for rid, _ in _best_fact_ranking(ix, qvec, 5)]

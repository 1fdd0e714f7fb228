"""The chunk prior: the walk of a reset on every chunk, which depends on the graph and the query settings
alone, so the synonyms stage saves it beside the graph (`save_chunk_prior`) and a query reads it
(`load_chunk_prior`); and the walk's edge-weight factors for a project (`project_walk_scale`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from hrag_cli.core import store
from hrag_cli.core.artifacts import quick_sum
from hrag_cli.core.config import Settings
from hrag_cli.core.project import ProjectDir
from hrag_cli.graph.model import CHUNK, EDGE_KINDS, VERTEX_KINDS
from hrag_cli.graph.push import PRIOR_EPS, walk_mass
from hrag_cli.graph.walk import Scale, WalkGraph, kind_factors, scale_key

PRIOR_FILE = "chunk_prior.npz"


def walk_scale(rules_graph: bool, synonym_weight: float) -> dict[str, float] | None:
    """The walk's edge weight factors: on a rules-extractor graph SYNONYM edges x `synonym_weight` (None: the
    stored weights). Those edges join names whose builtin vectors are close, i.e. names sharing words, which in
    a corpus where many people and works share a name's words lead the walk to the wrong namesake
    (bench/retrieval.py compares the settings)."""
    return {"SYNONYM": synonym_weight} if rules_graph and synonym_weight != 1.0 else None


def is_rules_graph(extractor: str) -> bool:
    """Whether the graph came from the rules extractor (its extract stage's `extractor` count)."""
    return extractor.startswith("rules")


def project_walk_scale(project: ProjectDir, settings: Settings) -> Scale:
    """`walk_scale` for a built project: its extract stage says whether the graph is a rules graph."""
    stage = project.stage("extract")
    extractor = str(stage.counts.get("extractor", "")) if stage is not None else ""
    return walk_scale(is_rules_graph(extractor), settings.query.rules_synonym_weight)


def _factor_row(scale: Scale) -> np.ndarray:
    factors = kind_factors(scale)
    return np.ones(len(EDGE_KINDS)) if factors is None else factors


def prior_key(damping: float, scale: Scale) -> tuple:
    return ("chunk_prior", float(damping), scale_key(scale))


def chunk_prior(graph: WalkGraph, damping: float, scale: Scale = None) -> np.ndarray:
    """`walk_mass` of a reset of 1 on every chunk: what a passage weight shared by every chunk adds to the
    walk. It depends on the graph and settings alone: the synonyms stage saves it (`save_chunk_prior`), and
    a query whose settings differ walks it once per process."""
    key = prior_key(damping, scale)
    if key not in graph.memo:
        chunks = (graph.vkind == VERTEX_KINDS.index(CHUNK)).astype(np.float64)
        graph.memo[key] = (walk_mass(graph, chunks, damping, scale, PRIOR_EPS) if chunks.any()
                           else np.zeros(graph.vcount()))
    return graph.memo[key]


def _prior_path(project: ProjectDir) -> Path:
    return project.graph_dir / PRIOR_FILE


def _walk_digest(project: ProjectDir) -> str:
    """Which walk.npz a saved prior was walked on (a sampled hash: reads a few samples, not the file)."""
    return quick_sum(project.walk_path, project.walk_path.stat().st_size)


def save_chunk_prior(project: ProjectDir, settings: Settings) -> None:
    """Write graph/chunk_prior.npz (atomically): the chunk prior of graph/walk.npz for the project's query
    settings, with those settings and the walk's digest, so a query reads it instead of walking every chunk."""
    q = settings.query
    scale = project_walk_scale(project, settings)
    prior = chunk_prior(WalkGraph.load(project), q.damping, scale)
    with store.atomic_writer(_prior_path(project)) as fh:
        np.savez(fh, prior=prior, damping=np.float64(q.damping), scale=_factor_row(scale),
                 walk=np.frombuffer(_walk_digest(project).encode(), dtype=np.uint8))


def load_chunk_prior(project: ProjectDir, graph: WalkGraph, damping: float, scale: Scale) -> None:
    """Put the saved chunk prior into `graph.memo` when it was walked on this walk.npz with these settings
    (otherwise `chunk_prior` walks it)."""
    key = prior_key(damping, scale)
    if key in graph.memo:
        return
    try:
        with np.load(_prior_path(project), allow_pickle=False) as z:
            same = (float(z["damping"]) == float(damping) and np.array_equal(z["scale"], _factor_row(scale))
                    and bytes(z["walk"]).decode() == _walk_digest(project) and z["prior"].shape == (graph.vcount(),))
            if same:
                graph.memo[key] = np.asarray(z["prior"], dtype=np.float64)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return          # missing or unreadable: walked instead

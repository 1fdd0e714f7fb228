"""The stages in the order they run: the one list of them. For each, the stages whose output digests its
fingerprint covers (upstream) and the files it writes (outputs).

It sits in core because the artifact checks every reader runs (artifacts.py, ProjectDir.check) need it;
hrag_cli/stages.py gives each declared stage its fingerprint and run functions, and the pipeline runs them in
this order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageDecl:
    name: str
    upstream: tuple[str, ...]   # stages whose output digests enter this stage's fingerprint
    # relative to a generation (a folder stands for every file in it); a file listed by two stages belongs to
    # the first (graph.pkl, walk.npz: resolve builds them, synonyms adds edges), which rebuilds it
    outputs: tuple[str, ...]


DECLARED: tuple[StageDecl, ...] = (
    StageDecl("chunk", (), ("docs.jsonl", "chunks.jsonl", "files.json")),
    # its records live in the extraction cache, outside every generation
    StageDecl("extract", ("chunk",), ()),
    # counts only: resolve prunes records as it reads them, so nothing on disk to damage
    StageDecl("prune", ("extract",), ()),
    # the graph holds chunk vertices too
    StageDecl("resolve", ("prune", "chunk"),
              ("graph/entities.jsonl", "graph/relations.jsonl", "graph/facts.jsonl", "graph/entities.patch",
               "graph/relations.patch", "graph/facts.patch", "graph/merges.jsonl",
               "graph/graph.pkl", "graph/walk.npz", "graph/resolve_state.bin",
               "graph/resolve_delta.json", "graph/changed_ids.json")),
    StageDecl("synonyms", ("resolve", "chunk"),
              ("graph/synonyms.jsonl", "graph/graph.pkl", "graph/walk.npz", "graph/chunk_prior.npz", "vectors")),
)
STAGES: tuple[str, ...] = tuple(d.name for d in DECLARED)
OUTPUTS: dict[str, tuple[str, ...]] = {d.name: d.outputs for d in DECLARED}

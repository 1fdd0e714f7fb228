"""The reranker stage, for every mode: the mode's best `rerank_top_k` chunks are scored against the query by a
rerank model and reordered by that score.

`query.rerank` (`--rerank MODEL`): a litellm rerank model (e.g. cohere/rerank-english-v3.0, or
hosted_vllm/NAME with `query.rerank_api_base` for a local server), called through the project's one LLM client
so every score is cached per (model, query, text piece); or `st:FOLDER`, a local sentence-transformers
cross-encoder (needs the `local` extra), cached per (query, piece) for the session. Rerankers read a few hundred
tokens at most, so a long chunk is split into `rerank_chunk_tokens` pieces and takes its best piece's score.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.query.types import Retrieval

PIECE_OVERLAP = 32   # tokens shared by consecutive pieces, so a sentence cut at a border is whole in one


def split_for_rerank(text: str, tokens: int) -> list[str]:
    """The pieces a reranker reads (the chunker's own token windows); a short text is one piece."""
    from hrag_cli.chunk.chunking import chunk_text

    pieces = [c.text for c in chunk_text(text, tokens=max(tokens, 16), overlap=min(PIECE_OVERLAP, tokens // 4))]
    return pieces or [text]


class CrossEncoderReranker:
    """A local sentence-transformers cross-encoder, loaded offline on first use."""

    def __init__(self, folder: str) -> None:
        if importlib.util.find_spec("sentence_transformers") is None:
            raise UsageError(f"reranker 'st:{folder}' needs sentence-transformers: install hrag[local]")
        if not Path(folder).expanduser().is_dir():
            raise UsageError(f"reranker folder not found: {folder} (give st:FOLDER with a cross-encoder model)")
        self.folder = str(Path(folder).expanduser().resolve())
        self._model: Any = None
        self._cache: dict[tuple[str, str], float] = {}

    def scores(self, query: str, texts: list[str]) -> list[float]:
        todo = list(dict.fromkeys(t for t in texts if (query, t) not in self._cache))
        if todo:
            if self._model is None:
                for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
                    os.environ.setdefault(var, "1")
                from sentence_transformers import CrossEncoder

                try:
                    self._model = CrossEncoder(self.folder, device="cpu", local_files_only=True)
                except Exception as exc:
                    msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                    raise UsageError(f"cannot load cross-encoder 'st:{self.folder}' offline: {msg}") from None
            out = self._model.predict([(query, t) for t in todo], show_progress_bar=False)
            self._cache.update({(query, t): float(s) for t, s in zip(todo, out)})
        return [self._cache[(query, t)] for t in texts]

    def close(self) -> None:
        pass


class ModelReranker:
    """A litellm rerank model through the project's query-time LLM client (cached in cache/query_llm.jsonl)."""

    def __init__(self, project: ProjectDir, settings: Settings, model: str) -> None:
        from hrag_cli.core.llm import query_client

        llm = replace(settings.llm, model=model, api_base=settings.query.rerank_api_base)
        self.client = query_client(project, llm)

    def scores(self, query: str, texts: list[str]) -> list[float]:
        return self.client.rerank(query, texts)

    def close(self) -> None:
        self.client.close()


def make_reranker(project: ProjectDir, settings: Settings) -> Any:
    """The reranker `query.rerank` names, or None when it is empty."""
    spec = settings.query.rerank.strip()
    if not spec:
        return None
    if spec.startswith("st:"):
        return CrossEncoderReranker(spec[3:])
    return ModelReranker(project, settings, spec)


def rerank(reranker: Any, r: Retrieval, top_k: int, piece_tokens: int) -> None:
    """Reorder the first `top_k` chunks by the reranker's score (a chunk's score: its best piece's); the rest
    keep their order after them. The chunk's score becomes the reranker's."""
    head, tail = r.chunks[:top_k], r.chunks[top_k:]
    if not head:
        return
    pieces = [split_for_rerank(c.text, piece_tokens) for c in head]
    flat = [p for ps in pieces for p in ps]
    scores = reranker.scores(r.query, flat)
    best: list[float] = []
    i = 0
    for ps in pieces:
        best.append(max(scores[i:i + len(ps)]))
        i += len(ps)
    order = sorted(range(len(head)), key=lambda j: -best[j])   # stable: ties keep the mode's order
    r.chunks = [replace(head[j], score=best[j]) for j in order] + tail

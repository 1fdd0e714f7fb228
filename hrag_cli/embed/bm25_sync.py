"""The BM25 index over chunk texts brought up to date by chunk id."""

from __future__ import annotations

from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir
from hrag_cli.embed.plans import Chunks


def sync_bm25(project: ProjectDir, chunks: "Chunks", appended: dict[str, str] | None, reporter: Reporter,
              total: int) -> dict:
    """BM25 over chunk texts, updated by chunk id (a chunk id is a hash of its text, so ids say it all).
    `appended`: only chunks were appended since the index was synced (none went): just those are looked at."""
    from hrag_cli.storage.bm25 import BM25_FILE, BM25Index

    path = project.vectors_dir / BM25_FILE
    bm = None
    if path.exists():
        try:
            bm = BM25Index.load(path)
        except Exception:
            reporter.warn(f"{path} is unreadable; rebuilding the BM25 index")
            bm = None
    if bm is None:
        bm, appended = BM25Index(), None
    texts, gone = appended or {}, []
    new = [i for i in texts if i not in bm]
    # the chunk index holds `total` chunks and was saved first: a run stopped between the two saves left BM25
    # short of chunks no later `appended` names, so then every chunk is compared
    if appended is None or len(bm) + len(new) != total:
        texts = chunks.all()
        have = set(bm.doc_ids())
        gone = [i for i in have if i not in texts]
        new = [i for i in texts if i not in have]
    for i in gone:
        bm.remove(i)
    bm.add_many((i, texts[i]) for i in new)
    if gone or new or not path.exists():
        bm.save(path)
    return {"bm25_chunks": len(bm), "bm25_added": len(new), "bm25_removed": len(gone)}

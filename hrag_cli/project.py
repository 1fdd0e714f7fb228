"""The project directory: where every artifact lives, the manifest of stage fingerprints, and the lock."""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from . import store
from .config import Settings, default_toml, load_settings
from .errors import ProjectLocked, UsageError

DEFAULT_PROJECT = ".hrag"
STAGES = ("chunk", "extract", "resolve", "synonyms")


def fingerprint(*parts: Any) -> str:
    """Stable short hash of any JSON-able data (dict keys sorted), for stage and cache keys."""
    data = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(data).hexdigest()[:24]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def resolve_root(option: str | Path | None) -> Path:
    """--project flag > HRAG_PROJECT > ./.hrag"""
    if option:
        return Path(option)
    env = os.environ.get("HRAG_PROJECT")
    return Path(env) if env else Path(DEFAULT_PROJECT)


@dataclass
class StageRecord:
    fingerprint: str
    output_digest: str
    finished_at: str
    counts: dict


class Project:
    """Paths of every artifact (DESIGN.md §2) plus manifest and lock handling."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        r = self.root
        self.toml_path = r / "hrag.toml"
        self.manifest_path = r / "manifest.json"
        self.lock_path = r / "lock"
        self.docs_path = r / "docs.jsonl"
        self.chunks_path = r / "chunks.jsonl"
        self.cache_dir = r / "cache"
        self.llm_cache_path = self.cache_dir / "llm.jsonl"
        self.extractions_path = self.cache_dir / "extractions.jsonl"
        self.summaries_path = self.cache_dir / "summaries.jsonl"
        self.embeddings_dir = self.cache_dir / "embeddings"
        self.graph_dir = r / "graph"
        self.entities_path = self.graph_dir / "entities.jsonl"
        self.relations_path = self.graph_dir / "relations.jsonl"
        self.facts_path = self.graph_dir / "facts.jsonl"
        self.synonyms_path = self.graph_dir / "synonyms.jsonl"
        self.graph_path = self.graph_dir / "graph.pkl"
        self.vectors_dir = r / "vectors"
        self._lock_fh: Any = None

    # -- life cycle -----------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.manifest_path.exists() or self.toml_path.exists()

    def init(self) -> None:
        """Create the folders and a commented hrag.toml on first use; never touches existing files."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"project path {self.root} exists and is not a directory")
        for d in (self.root, self.cache_dir, self.embeddings_dir, self.graph_dir, self.vectors_dir):
            d.mkdir(parents=True, exist_ok=True)
        if not self.toml_path.exists():
            store.atomic_write_text(self.toml_path, default_toml())

    def require(self) -> None:
        """For read-only commands: a missing project is a usage error, not an empty result."""
        if not self.exists():
            raise UsageError(f"no hrag project at {self.root} (run 'hrag index DOCS' first, or pass --project)")

    def settings(self, overrides: dict[str, Any] | None = None) -> Settings:
        return load_settings(self.toml_path, overrides)

    # -- manifest -------------------------------------------------------------------------------------
    def manifest(self) -> dict:
        try:
            data = store.read_json(self.manifest_path, default=None)
        except orjson.JSONDecodeError:
            data = False    # not JSON at all: damaged like a manifest of the wrong shape
        if data is None:
            return {"version": 1, "stages": {}}
        if not isinstance(data, dict) or not isinstance(data.get("stages"), dict):
            raise UsageError(f"{self.manifest_path} is damaged; remove it to rebuild every stage")
        return data

    def stage(self, name: str) -> StageRecord | None:
        rec = self.manifest()["stages"].get(name)
        if not rec:
            return None
        return StageRecord(rec.get("fingerprint", ""), rec.get("output_digest", ""),
                           rec.get("finished_at", ""), rec.get("counts", {}))

    def record_stage(self, name: str, fp: str, output_digest: str, counts: dict | None = None) -> None:
        """Mark a stage done; later stages compare their stored input digest against `output_digest`."""
        data = self.manifest()
        data["stages"][name] = {
            "fingerprint": fp,
            "output_digest": output_digest,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "counts": counts or {},
        }
        store.write_json(self.manifest_path, data)

    def forget_stage(self, name: str) -> None:
        data = self.manifest()
        if data["stages"].pop(name, None) is not None:
            store.write_json(self.manifest_path, data)

    def stage_state(self, name: str, expected_fp: str) -> str:
        """fresh / stale / missing, for `hrag status` and for skipping unchanged stages."""
        rec = self.stage(name)
        if rec is None:
            return "missing"
        return "fresh" if rec.fingerprint == expected_fp else "stale"

    # -- lock -----------------------------------------------------------------------------------------
    @property
    def holds_lock(self) -> bool:
        """True inside `with project.lock()`: append-only caches may then repair torn tails."""
        return self._lock_fh is not None

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive writer lock (flock, released by the kernel if the process dies); a second writer fails
        at once instead of waiting, which is what a cron job wants."""
        self.init()
        fh = open(self.lock_path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise ProjectLocked(f"project {self.root} is locked by {holder}; wait for it to finish") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        self._lock_fh = fh
        try:
            yield
        finally:
            try:
                fh.seek(0)
                fh.truncate()
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
                fh.close()
                self._lock_fh = None


@dataclass
class StageOutcome:
    """What every stage function returns: counts for the manifest and status, and a digest of what it wrote
    (downstream fingerprints include it, so a changed output makes them stale)."""

    counts: dict
    output_digest: str

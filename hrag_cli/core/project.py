"""The project directory: where every artifact lives, the manifest of stage fingerprints, and the lock.

Generations: a stage's outputs (docs.jsonl, chunks.jsonl, graph/, vectors/ and the manifest that vouches for
them) live in gens/<n>/, and the symlink `current` names the complete one. A writer copies the current
generation by hard links into a new one, rewrites files there (always whole, through store's atomic helpers,
never in place: a file is shared with the older generation until it is replaced), and switches `current` in one
rename at the end, deleting every older generation no reader pins. A reader resolves and pins `current`
once, so it opens one complete generation, never half of two, while a rebuild runs. The root keeps symlinks (graph, vectors, manifest.json, ...) into `current` for people.

The manifest records, per stage, the size and hashes of every file the stage wrote (artifacts.py); `check()`
compares them with the disk, so a damaged or deleted file is named, refused by readers and rebuilt by
`hrag index`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hrag_cli.core import artifacts
from hrag_cli.core import store
from hrag_cli.core.config import Settings, default_toml, load_settings
from hrag_cli.core.errors import HragError, ProjectLocked, UsageError
from hrag_cli.core.stage_list import STAGES

DEFAULT_PROJECT = ".hrag"
GEN_ENTRIES = ("manifest.json", "docs.jsonl", "chunks.jsonl", "files.json", "graph", "vectors")
# What a plain `hrag index` needs from the manifest, also kept in project.json at the root (outside every
# generation), so a damaged or deleted manifest is rebuilt without the user giving DOCS again.
DURABLE = {"chunk": ("roots", "imported_from"), "extract": ("extractor", "openie_file")}


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


class ProjectDir:
    """Paths of every artifact (docs/formats.md) plus manifest and lock handling."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        r = self.root
        self.toml_path = r / "hrag.toml"
        self.durable_path = r / "project.json"
        self.lock_path = r / "lock"
        self.cache_dir = r / "cache"
        self.llm_cache_path = self.cache_dir / "llm.jsonl"
        self.query_llm_cache_path = self.cache_dir / "query_llm.jsonl"   # `hrag query`'s own LLM calls
        self.extractions_path = self.cache_dir / "extractions.jsonl"
        self.summaries_path = self.cache_dir / "summaries.jsonl"
        self.embeddings_dir = self.cache_dir / "embeddings"
        self.gens_dir = r / "gens"
        self.current_link = r / "current"
        self._lock_fh: Any = None
        self._pin_fh: Any = None
        self._writing: Path | None = None   # the generation a writer is filling
        self._discard = False
        self._set_gen(self._current_gen())

    # -- generations ------------------------------------------------------------------------------------
    def _current_gen(self) -> Path:
        """The generation `current` names, pinned (a project from before generations: the root).

        Pin, then read `current` again: a writer may switch and delete the generation between our readlink
        and our flock, so a pin only counts once `current` still names what we pinned."""
        for _ in range(100):
            try:
                target = os.readlink(self.current_link)
            except (FileNotFoundError, OSError):
                return self.root
            gen = self.root / target
            self._pin(gen)
            try:
                if os.readlink(self.current_link) == target:
                    return gen
            except OSError:
                return self.root
        raise HragError(f"project {self.root} switched versions 100 times while opening it; try again")

    def _pin(self, gen: Path) -> None:
        """A shared flock on the generation this object reads, so a writer never deletes it underneath (a
        read-only project gets no pin; nothing can delete its generations then either)."""
        try:
            fh = open(gen / ".pin", "a")
        except OSError:
            self._unpin()
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
        self._unpin()
        self._pin_fh = fh

    def _unpin(self) -> None:
        if self._pin_fh is not None:
            self._pin_fh.close()
            self._pin_fh = None

    def __del__(self) -> None:
        self._unpin()

    def _set_gen(self, gen: Path) -> None:
        self.gen_dir = gen
        self.manifest_path = gen / "manifest.json"
        self.docs_path = gen / "docs.jsonl"
        self.chunks_path = gen / "chunks.jsonl"
        self.files_path = gen / "files.json"      # each document file's stat stamp, so an unchanged one goes unread
        self.graph_dir = gen / "graph"
        self.entities_path = self.graph_dir / "entities.jsonl"
        self.relations_path = self.graph_dir / "relations.jsonl"
        self.facts_path = self.graph_dir / "facts.jsonl"
        self.merges_path = self.graph_dir / "merges.jsonl"      # which names resolve joined or split
        self.synonyms_path = self.graph_dir / "synonyms.jsonl"
        self.graph_path = self.graph_dir / "graph.pkl"
        self.walk_path = self.graph_dir / "walk.npz"            # the graph as a query walks it (walk.py)
        self.resolve_state_path = self.graph_dir / "resolve_state.bin"   # resolve's accumulators (resolve/state.py)
        self.changed_ids_path = self.graph_dir / "changed_ids.json"      # what a patching resolve changed
        self.vectors_dir = gen / "vectors"

    def _gen_numbers(self) -> list[int]:
        try:
            return sorted(int(p.name) for p in self.gens_dir.iterdir() if p.name.isdigit())
        except FileNotFoundError:
            return []

    @contextmanager
    def generation(self) -> Iterator[None]:
        """Inside the writer lock: fill a new generation (hard-linked from the current one) and make it
        current when the block ends normally. On an error or a kill the old generation stays current; the
        caches in cache/ keep whatever work was paid for."""
        assert self.holds_lock, "generation() needs the writer lock"
        src = self.gen_dir
        nums = self._gen_numbers()
        new = self.gens_dir / str((nums[-1] + 1) if nums else 1)
        new.mkdir(parents=True)
        for name in GEN_ENTRIES:
            _link_tree(src / name, new / name)
        for d in ("graph", "vectors"):
            (new / d).mkdir(exist_ok=True)
        self._unpin()
        self._writing = new
        self._discard = False
        self._set_gen(new)
        try:
            yield
        except BaseException:
            self._writing = None
            self._set_gen(src)
            shutil.rmtree(new, ignore_errors=True)
            raise
        self._writing = None
        if self._discard:
            self._set_gen(self._current_gen())
            shutil.rmtree(new, ignore_errors=True)
        else:
            self._switch(new)

    def discard_generation(self) -> None:
        """The run stopped short (a budget stop): keep the previous version current; the caches keep the work."""
        self._discard = True

    def _switch(self, new: Path) -> None:
        """Point `current` at `new` in one rename, give the root its symlinks, drop unpinned old generations."""
        self._unpin()
        tmp = self.root / f".current.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(os.path.relpath(new, self.root), tmp)
        os.replace(tmp, self.current_link)
        for name in GEN_ENTRIES:    # a project from before generations: its own files move into gens/
            link = self.root / name
            if link.is_symlink():
                continue
            if link.is_dir():
                shutil.rmtree(link)
            else:
                link.unlink(missing_ok=True)
            os.symlink(os.path.join("current", name), link)
        self._set_gen(self._current_gen())
        self._save_durable()
        for n in self._gen_numbers():   # old versions go now, unless a reader still reads one
            if str(n) != new.name:
                _remove_unpinned(self.gens_dir / str(n))

    # -- life cycle -----------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.manifest_path.exists() or self.toml_path.exists()

    def init(self) -> None:
        """Create the folders, an empty first generation and a commented hrag.toml on first use; never touches
        existing files."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"project path {self.root} exists and is not a directory")
        for d in (self.root, self.cache_dir, self.embeddings_dir):
            d.mkdir(parents=True, exist_ok=True)
        if not self.current_link.is_symlink() and not (self.root / "manifest.json").exists():
            first = self.gens_dir / "0"
            for d in ("graph", "vectors"):
                (first / d).mkdir(parents=True, exist_ok=True)
            self._switch(first)
        if not self.toml_path.exists():
            store.atomic_write_text(self.toml_path, default_toml())

    def unused(self) -> bool:
        """Nothing was ever committed or paid for here (no current version beyond the empty first one, an
        empty cache/): a project a failed first run may remove."""
        if self._gen_numbers() not in ([], [0]) or (self.root / "manifest.json").is_file():
            return False
        return not any(p.is_file() and p.stat().st_size for p in self.cache_dir.rglob("*"))

    def require(self) -> None:
        """For read-only commands: a missing project is a usage error, not an empty result."""
        if not self.exists():
            raise UsageError(f"no hrag project at {self.root} (run 'hrag index DOCS' first, or pass --project)")

    def settings(self, overrides: dict[str, Any] | None = None) -> Settings:
        return load_settings(self.toml_path, overrides, remembered=self.remembered())

    # -- what the project was built with ----------------------------------------------------------------
    REMEMBERED = ("extract.extractor", "llm.model", "llm.api_base", "extract.schema", "extract.format", "extract.hints",
                  "embed.model", "embed.api_base",
                  "embed.precision", "cluster.ray")

    def remembered(self) -> dict[str, Any]:
        """The extractor, LLM model and API base, and the embedder, the project was last built with (never a key): a plain
        `hrag index -p P` (a cron job) reuses them instead of silently falling back to the defaults."""
        try:
            manifest = self.manifest() if self.manifest_path.exists() else None
        except HragError:
            manifest = None
        # damaged or gone: project.json keeps what the last complete run was built with
        data = (self._durable() if manifest is None else manifest).get("built_with")
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k in self.REMEMBERED}
        if manifest is None:
            return {}
        # a project from before this was remembered: its extract stage names the LLM it was built with
        extractor = str(manifest["stages"].get("extract", {}).get("counts", {}).get("extractor", ""))
        if extractor.startswith("llm:"):
            return {"extract.extractor": "llm", "llm.model": extractor[4:].rsplit(":", 1)[0]}
        return {}

    def remember(self, values: dict[str, Any]) -> None:
        data = self.manifest()
        data["built_with"] = {k: values[k] for k in self.REMEMBERED if k in values}
        store.write_json(self.manifest_path, data)

    # -- manifest -------------------------------------------------------------------------------------
    def manifest(self) -> dict:
        try:
            data = store.read_json(self.manifest_path, default=None)
        except orjson.JSONDecodeError:
            data = False    # not JSON at all: damaged like a manifest of the wrong shape
        if data is None and self.gen_dir != self.root and self._durable():
            raise HragError(f"{self.manifest_path} is missing: run 'hrag index -p {self.root}' to rebuild "
                            "every stage (the caches keep extractions and embeddings)")
        if data is None:
            return {"version": 1, "stages": {}}
        if (not isinstance(data, dict) or not isinstance(data.get("stages"), dict)
                or not all(isinstance(v, dict) for v in data["stages"].values())):
            docs = "" if self._durable().get("chunk", {}).get("roots") else "DOCS "
            raise HragError(f"{self.manifest_path} is damaged: run 'hrag index {docs}-p {self.root}' to rebuild "
                            "every stage (the caches keep extractions and embeddings)")
        return data

    def stage(self, name: str) -> StageRecord | None:
        rec = self.manifest()["stages"].get(name)
        if not rec:
            return None
        return StageRecord(rec.get("fingerprint", ""), rec.get("output_digest", ""),
                           rec.get("finished_at", ""), rec.get("counts", {}))

    def record_stage(self, name: str, fp: str, output_digest: str, counts: dict | None = None) -> None:
        """Mark a stage done; later stages compare their stored input digest against `output_digest`. The
        record lists every file the stage wrote with its size and hashes (see `check`)."""
        data = self.manifest()
        # a forgotten record's hashes still vouch for the files it listed (see forget_stage); used once
        forgotten = data.get("forgotten") or {}
        old = {**forgotten.pop(name, {}), **((data["stages"].get(name) or {}).get("artifacts") or {})}
        if not forgotten:
            data.pop("forgotten", None)
        data["stages"][name] = {
            "fingerprint": fp,
            "output_digest": output_digest,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "counts": counts or {},
            "artifacts": artifacts.record(self.gen_dir, name, old),
        }
        store.write_json(self.manifest_path, data)

    def _save_durable(self) -> None:
        """At a switch: what a plain run needs of the new current manifest goes to project.json too."""
        try:
            manifest = self.manifest()
        except HragError:
            return
        stages = manifest["stages"]
        data = {stage: {k: stages[stage]["counts"][k] for k in keys
                        if (stages.get(stage) or {}).get("counts", {}).get(k) is not None}
                for stage, keys in DURABLE.items()}
        data = {k: v for k, v in data.items() if v}
        if isinstance(manifest.get("built_with"), dict):   # what the run's settings were, where one records them
            data["built_with"] = manifest["built_with"]
        if data and data != self._durable():
            store.write_json(self.durable_path, data)

    def _durable(self) -> dict:
        try:
            data = store.read_json(self.durable_path, default={})
        except (orjson.JSONDecodeError, OSError):
            return {}   # damaged: the manifest still has it, and the next commit rewrites it
        return data if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()) else {}

    def recorded(self, stage: str, key: str) -> Any:
        """A setting a plain `hrag index` reuses (DURABLE): from the manifest, or from project.json when the
        manifest is damaged or gone."""
        try:
            rec = self.stage(stage)
        except HragError:
            rec = None
        value = rec.counts.get(key) if rec is not None else None
        return value if value is not None else self._durable().get(stage, {}).get(key)

    def drop_damaged_manifest(self) -> bool:
        """Inside a new generation only: a manifest that cannot be read is replaced by an empty one, so every stage rebuilds
        from its inputs and the caches. True when it was damaged."""
        assert self._writing is not None, "only a writer's new generation may lose its manifest"
        try:
            self.manifest()
            return False
        except HragError:
            store.write_json(self.manifest_path, {"version": 1, "stages": {}})
            return True

    def invalidate_stage(self, name: str) -> None:
        """Before a stage touches its outputs: its record stops vouching for them (stale, counts kept), so a
        kill part-way can never leave new files under the old fingerprint."""
        data = self.manifest()
        rec = data["stages"].get(name)
        if rec is not None and rec.get("fingerprint"):
            rec["fingerprint"] = ""
            store.write_json(self.manifest_path, data)

    def check(self, full: bool = False, stages: tuple[str, ...] = STAGES) -> list[artifacts.Problem]:
        """Every recorded artifact of `stages` against the disk: size and quick hash (a few samples a file),
        or the whole-file hash with `full`. A file two stages wrote is checked against the later record."""
        records = self.manifest()["stages"]
        recorded: dict[str, dict] = {}
        for name in STAGES:   # in stage order, so a later stage's record of a shared file wins
            for rel, meta in ((records.get(name) or {}).get("artifacts") or {}).items():
                if artifacts.owner(rel) in stages and isinstance(meta, dict):
                    recorded[rel] = meta
        problems = []
        for rel, meta in sorted(recorded.items()):
            reason = artifacts.check_one(self.gen_dir / rel, meta, full)
            if reason:
                problems.append(artifacts.Problem(rel, reason, artifacts.owner(rel)))
        return problems

    def require_intact(self) -> None:
        """For readers: refuse to answer from a damaged index (exit 1, the file and the fix)."""
        problems = self.check()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise HragError(f"{problems[0]}{more}: run 'hrag index -p {self.root}' to rebuild it")

    def remove_outputs(self, stage: str) -> None:
        """Before rebuilding a damaged stage from its inputs: its files go, so incremental stages (the vector
        indices) start clean instead of extending a damaged file."""
        for rel in list(artifacts.files(self.gen_dir, stage)):
            if artifacts.owner(rel) == stage:
                (self.gen_dir / rel).unlink(missing_ok=True)

    def forget_stage(self, name: str) -> None:
        """The stage is missing (it must run), but the hashes its record took of its files are kept aside: its
        next record reuses those of files unchanged since (same size, mtime and quick hash), as a stale record's
        are, instead of reading every file whole again (resolve forgets synonyms, whose large vector files a
        small run mostly leaves alone)."""
        data = self.manifest()
        rec = data["stages"].pop(name, None)
        if rec is not None:
            if rec.get("artifacts"):
                data.setdefault("forgotten", {})[name] = rec["artifacts"]
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
            raise ProjectLocked(f"project {self.root} is locked by {holder} (another hrag run); nothing was "
                                f"changed, try again when it finishes") from None
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


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link copy (cheap at any size; safe because every artifact is replaced by rename, never edited)."""
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        for p in src.iterdir():
            if not p.name.startswith("."):
                _link_tree(p, dst / p.name)
    elif src.is_file():
        try:
            os.link(src, dst)
        except OSError:   # a file system without hard links
            shutil.copy2(src, dst)


def _remove_unpinned(gen: Path) -> None:
    """Delete an old generation unless a reader still holds its pin."""
    try:
        fh = open(gen / ".pin", "a")
    except OSError:
        shutil.rmtree(gen, ignore_errors=True)
        return
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        shutil.rmtree(gen, ignore_errors=True)


@dataclass
class StageOutcome:
    """What every stage function returns: counts for the manifest and status, and a digest of what it wrote
    (downstream fingerprints include it, so a changed output makes them stale). Two counts steer the commit:
    `pending` > 0 (work left: the record is dropped so the next run continues it) and `review_only` (the stage
    changed nothing: its record stays as it was). `payload`: what the next stage of the same run may take in
    memory instead of reading it back from disk (the chunks just cut); dropped once that stage has run."""

    counts: dict
    output_digest: str
    payload: Any = None


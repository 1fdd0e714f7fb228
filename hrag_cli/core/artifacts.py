"""What each stage wrote and whether it is still intact: per file a size, a quick hash of sampled blocks (read
on every open by readers) and a whole-file hash (`hrag status --verify`), recorded in the manifest at commit.

Generic over a stage's list of files and folders (stage_list.py), so a new or renamed file under vectors/ is
covered without a change here.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hrag_cli.core.stage_list import OUTPUTS, STAGES

NOT_ARTIFACTS = ("synonym_decisions.jsonl",)   # reviewed decisions are user input, never rebuilt
_SAMPLE = 1 << 16


def quick_sum(path: Path, size: int) -> str:
    """Hash of the size, the first and last 64 KiB and eight blocks between: reads a few hundred KiB whatever
    the size, and catches a cut, emptied, zeroed or swapped file (a reader runs it on every open)."""
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as fh:
        if size <= 4 * _SAMPLE:
            h.update(fh.read())
        else:
            for pos in [0, *(size * i // 9 for i in range(1, 9)), size - _SAMPLE]:
                fh.seek(pos)
                h.update(fh.read(_SAMPLE if pos in (0, size - _SAMPLE) else 4096))
    return h.hexdigest()


FULL_HASH_MAX = 256 << 20   # bigger files: `--verify` hashes 4 KiB of every MiB (a run must not pay seconds
                            # re-reading gigabytes of vectors it just wrote)
_CRC = "crc32:"             # the whole-file hash a commit records: CRC-32, several times faster than blake2b
                            # (a run hashes every file it rewrote); it catches every burst of up to 32 bits and
                            # all but 2^-32 of other damage, which is what it is for


def full_sum(path: Path, size: int, like: str | None = None) -> str:
    """Whole-file hash for files up to FULL_HASH_MAX, else a dense sample (4 KiB of every MiB, all of the
    last MiB): what `hrag status --verify` compares and the commit records. `like`: a recorded value, so one
    recorded before CRC-32 (a blake2b hex digest) is computed its own way."""
    with open(path, "rb") as fh:
        if size <= FULL_HASH_MAX:
            if like is not None and not like.startswith(_CRC):
                return hashlib.file_digest(fh, lambda: hashlib.blake2b(digest_size=16)).hexdigest()
            crc, buf = 0, bytearray(1 << 20)
            while n := fh.readinto(buf):
                crc = zlib.crc32(memoryview(buf)[:n], crc)
            return f"{_CRC}{crc:08x}"
        h = hashlib.blake2b(f"dense:{size}".encode(), digest_size=16)
        for pos in range(0, size - (1 << 20), 1 << 20):
            fh.seek(pos)
            h.update(fh.read(4096))
        fh.seek(max(0, size - (1 << 20)))
        h.update(fh.read())
        return h.hexdigest()


def owner(rel: str) -> str:
    """The stage that rebuilds artifact `rel` (relative to a generation)."""
    for stage in STAGES:
        for out in OUTPUTS[stage]:
            if rel == out or rel.startswith(out + "/"):
                return stage
    return ""


@dataclass
class Problem:
    """One artifact that does not match the manifest."""

    path: str      # relative to the generation, e.g. graph/entities.jsonl
    reason: str
    stage: str     # the stage whose rerun rebuilds it

    def __str__(self) -> str:
        return f"{self.path} is {self.reason}"


def files(gen_dir: Path, stage: str) -> Iterator[str]:
    """The files `stage` wrote, relative to its generation (dot files and user decisions left out)."""
    for out in OUTPUTS.get(stage, ()):
        path = gen_dir / out
        if path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.is_file() and not p.name.startswith(".") and p.name not in NOT_ARTIFACTS:
                    yield str(p.relative_to(gen_dir))
        elif path.is_file():
            yield out


def record(gen_dir: Path, stage: str, old: dict) -> dict:
    """rel path -> size, mtime, quick and full hash of every file `stage` wrote; a file unchanged since `old`
    (same size, mtime and quick hash) keeps its full hash instead of being read whole again."""
    out = {}
    for rel in files(gen_dir, stage):
        st = (gen_dir / rel).stat()
        prev = old.get(rel) or {}
        quick = quick_sum(gen_dir / rel, st.st_size)
        same = (prev.get("size"), prev.get("mtime_ns"), prev.get("quick")) == (st.st_size, st.st_mtime_ns, quick)
        full = prev["full"] if same and prev.get("full") else full_sum(gen_dir / rel, st.st_size)
        out[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "quick": quick, "full": full}
    return out


def check_one(path: Path, meta: dict, full: bool) -> str:
    """Why `path` no longer matches its record ("" when it does)."""
    try:
        size = path.stat().st_size
        if size != meta.get("size"):
            return f"damaged ({size} bytes, {meta.get('size')} expected)"
        if quick_sum(path, size) != meta.get("quick"):
            return "damaged (its contents changed)"
        if full and meta.get("full") and full_sum(path, size, meta["full"]) != meta["full"]:
            return "damaged (its full hash differs)"
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return ""

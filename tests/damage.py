"""The damage matrix: every project file x (truncate, empty, delete, zero) -> what status, query and a plain
`hrag index` do. Shared by tests/test_damage.py (asserts the contract) and bench/damage_matrix.py (prints the
whole table). Commands run in-process through the real CLI entry point, so a case costs milliseconds.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

DAMAGES = ("truncate", "empty", "delete", "zero")
# one query per mode family that opens a different set of artifacts
QUERIES = (("ppr", "Who founded the institute that warned of the Great Flood of 1987?"),
           ("mix", "flood warning institute founder"),
           ("naive", "river delta archive"),
           ("bm25", "harbour museum"))
SKIP = {"lock", "hrag.toml"}


def cli(*args: str) -> tuple[int, str, str]:
    """Run `hrag ARGS` in this process; returns (exit code, stdout, stderr)."""
    from hrag_cli import cli as cli_mod

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["hrag", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli_mod.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def answers(root: Path, queries: tuple = QUERIES) -> tuple[int, list, str]:
    """(exit code, the chunk ids each query returned, stderr of the first failure)."""
    got = []
    for mode, q in queries:
        code, out, err = cli("query", q, "-p", str(root), "--mode", mode, "--json")
        if code != 0:
            return code, got, err
        got.append([c["chunk_id"] for c in orjson.loads(out)["chunks"]])
    return 0, got, ""


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "delete":
        path.unlink()
    elif how == "zero":
        path.write_bytes(b"\0" * len(data))
    else:
        raise ValueError(how)


def project_files(root: Path) -> list[str]:
    """Every file as a user sees it (graph/entities.jsonl, not the generation folder it lives in)."""
    out = []
    for top in sorted(root.iterdir()):
        if top.name in ("gens", "current") or top.name in SKIP:
            continue
        paths = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        out += [str(p.relative_to(root)) for p in paths if not p.name.startswith(".")]
    return sorted(out)


def run_case(built: Path, work: Path, rel: str, how: str, baseline: list, queries: tuple = QUERIES,
             docs: tuple[str, ...] = ()) -> dict:
    """Copy the built project, damage one file, then status / query / index / query."""
    root = work / f"{rel.replace('/', '_')}-{how}"
    shutil.copytree(built, root, symlinks=True)
    target = (root / rel).resolve()   # the file itself, not the root's symlink into the current generation
    if not target.exists():
        return {}
    damage(target, how)
    s_code, s_out, s_err = cli("status", "-p", str(root))
    status = "error" if s_code else ("flags" if "damaged" in s_out else "clean")
    q_code, got, q_err = answers(root, queries)
    if q_code == 0:
        query = "same" if got == baseline else "WRONG"
    else:
        query = f"refuse{q_code}" if len(q_err.strip().splitlines()) == 1 else f"crash{q_code}"
    i_code, _, i_err = cli("index", "-p", str(root), "-q")
    how_restored = "restored"
    if i_code != 0 and "hrag index DOCS" in i_err and docs:   # the message asks for DOCS: give them, as a user would
        i_code, _, i_err = cli("index", *docs, "-p", str(root), "-q")
        how_restored = "restored-with-DOCS"
    a_code, again, a_err = answers(root, queries)
    index = how_restored if (i_code == 0 and a_code == 0 and again == baseline) else f"NOT(i{i_code},q{a_code})"
    return {"status": status, "query": query, "index": index, "query_err": q_err.strip(),
            "index_err": (i_err or a_err).strip()}


def build(root: Path, corpus: Path, queries: tuple = QUERIES) -> list:
    code, _, err = cli("index", str(corpus), "-p", str(root), "-q", "--extractor", "rules",
                       "--embed-model", "builtin")
    assert code == 0, err
    code, base, err = answers(root, queries)
    assert code == 0, err
    return base


def matrix(built: Path, work: Path, baseline: list, files: list[str] | None = None,
           progress: Callable[[str], None] | None = None, docs: tuple[str, ...] = ()) -> dict[tuple[str, str], dict]:
    out = {}
    for rel in files or project_files(built):
        for how in DAMAGES:
            out[(rel, how)] = run_case(built, work, rel, how, baseline, docs=docs)
            if progress:
                progress(f"{rel} {how} {out[(rel, how)]}")
    return out

"""Reviewing synonym pairs: the TSV written for a reviewer and read back, and the decisions kept in
graph/synonym_decisions.jsonl and applied on every later run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hrag_cli.core import store
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir

DECISIONS_FILE = "synonym_decisions.jsonl"
TSV_COLUMNS = ("a", "b", "a_name", "b_name", "similarity", "action")
ACTIONS = ("link", "merge", "skip")


def _cell(text: str) -> str:
    return " ".join(str(text).split())


def write_review(path: Path, rows: list[dict], names: dict[str, str]) -> None:
    lines = ["\t".join(TSV_COLUMNS)]
    for r in rows:
        a, b = r["a"], r["b"]
        lines.append("\t".join([a, b, _cell(names.get(a, a)), _cell(names.get(b, b)),
                                f"{r['similarity']:.4f}", r["action"]]))
    try:
        store.atomic_write_text(Path(path), "\n".join(lines) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write review file {path}: {exc.strerror or exc}") from None


def read_review(path: Path, names: dict[str, str]) -> list[dict]:
    """Parse a reviewed TSV; every problem is a one-line UsageError raised before anything is written."""
    text = store.read_input_text(path, "--accept")
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise UsageError(f"{path}: empty review file")
    header = [h.strip().lower() for h in lines[0][1].split("\t")]
    if not {"a", "b", "action"} <= set(header):
        raise UsageError(f"{path}: the first line must name the columns {', '.join(TSV_COLUMNS)}")
    col = {h: i for i, h in enumerate(header)}
    out: list[dict] = []
    for n, ln in lines[1:]:
        cells = ln.split("\t")
        if len(cells) < len(header):
            raise UsageError(f"{path}:{n}: expected {len(header)} tab-separated columns, got {len(cells)}")
        a, b = cells[col["a"]].strip(), cells[col["b"]].strip()
        action = cells[col["action"]].strip().lower()
        if action not in ACTIONS:
            raise UsageError(f"{path}:{n}: action must be link, merge or skip, not {action!r}")
        for x in (a, b):
            if x not in names:
                raise UsageError(f"{path}:{n}: unknown entity id {x!r}")
        if a == b:
            raise UsageError(f"{path}:{n}: an entity cannot be its own synonym")
        sim = None
        if "similarity" in col and cells[col["similarity"]].strip():
            try:
                sim = float(cells[col["similarity"]])
            except ValueError:
                raise UsageError(f"{path}:{n}: similarity {cells[col['similarity']]!r} is not a number") from None
        out.append({"a": a, "b": b, "action": action, "similarity": sim})
    return out


def load_decisions(project: ProjectDir) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for r in store.read_jsonl(project.graph_dir / DECISIONS_FILE):
        if not (isinstance(r, dict) and isinstance(r.get("a"), str) and isinstance(r.get("b"), str)
                and r.get("action") in ACTIONS):
            continue   # a hand-edited or damaged line: skipped like any bad JSONL line
        a, b = r["a"], r["b"]
        out[(a, b) if a < b else (b, a)] = r
    return out


def save_decisions(project: ProjectDir, decisions: dict[tuple[str, str], dict]) -> None:
    store.write_jsonl(project.graph_dir / DECISIONS_FILE, (decisions[k] for k in sorted(decisions)))


def apply_decisions(pairs: dict[tuple[str, str], float], decisions: dict[tuple[str, str], dict],
                    names: dict[str, str]) -> tuple[dict[tuple[str, str], float], int, int]:
    """Auto pairs overridden by reviewed decisions; returns (pairs, links added, merges)."""
    out = dict(pairs)
    added = merges = 0
    for key, d in decisions.items():
        if key[0] not in names or key[1] not in names:
            continue
        if d["action"] == "skip":
            out.pop(key, None)
        elif d["action"] == "merge":
            out[key] = 1.0
            merges += 1
        else:
            if key not in out:
                added += 1
            sim = d.get("similarity")
            out[key] = float(sim) if sim is not None else out.get(key, 1.0)
    return out, added, merges


def accept(decisions: dict[tuple[str, str], dict], accepted: list[dict], auto: dict[tuple[str, str], float],
           cosine: Callable[[str, str], float]) -> None:
    """The rows of a reviewed file (`read_review`) put into `decisions`; a pair the reviewer added by hand
    takes its real cosine (`cosine` of the two ids)."""
    for r in accepted:
        a, b = r["a"], r["b"]
        key = (a, b) if a < b else (b, a)
        sim = r["similarity"] if r["similarity"] is not None else auto.get(key)
        if sim is None:
            sim = cosine(a, b)
        decisions[key] = {"a": key[0], "b": key[1], "action": r["action"], "similarity": sim}


def review_rows(auto: dict[tuple[str, str], float], decisions: dict[tuple[str, str], dict],
                names: Any) -> list[dict]:
    """The rows of a review file: every found pair (as decided, else `link`), then the decided pairs not
    found, best similarity first."""
    rows = []
    for key, sim in auto.items():
        d = decisions.get(key)
        rows.append({"a": key[0], "b": key[1], "similarity": sim, "action": d["action"] if d else "link"})
    for key, d in decisions.items():
        if key not in auto and key[0] in names and key[1] in names:
            rows.append({"a": key[0], "b": key[1], "similarity": d.get("similarity") or 0.0,
                         "action": d["action"]})
    rows.sort(key=lambda r: (-r["similarity"], r["a"], r["b"]))
    return rows

"""What an index run did, in a user's words: files read / unchanged / skipped, chunks new / removed, the graph,
the time; and the files that were not indexed with their reasons. `--json` keeps every internal count."""

from __future__ import annotations

from typing import Any

SHOWN_SKIPPED = 20


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def by_ext(counts: dict[str, int]) -> str:
    """`.png 5, .svg 3`, the most first."""
    return ", ".join(f"{ext} {n}" for ext, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def files_line(chunk: dict[str, Any]) -> str:
    """`files: 200 read, 3 unchanged, 8 skipped (unsupported type 8: .png 5, .svg 3)`."""
    skipped = int(chunk.get("skipped_files", 0))
    line = (f"files: {chunk.get('read_files', 0)} read, {chunk.get('unread_files', 0)} unchanged, "
            f"{skipped} skipped")
    if skipped:
        reasons = ", ".join(f"{r} {n}" for r, n in chunk.get("skipped_by_reason", {}).items())
        line += f" ({reasons}; by type: {by_ext(chunk.get('skipped_by_ext', {}))})"
    if chunk.get("excluded_files"):
        line += f", {chunk['excluded_files']} left out by --include/--exclude"
    if chunk.get("skipped_records"):
        line += f", {_n(chunk['skipped_records'], 'JSONL record')} skipped"
    return line


def skipped_lines(chunk: dict[str, Any], limit: int | None = SHOWN_SKIPPED) -> list[str]:
    """`  path: reason` for the files not indexed, the first `limit` of them, then how many more."""
    items = list(chunk.get("skipped") or [])
    shown = items if limit is None else items[:limit]
    out = [f"  {line}" for line in shown]
    if len(items) > len(shown):
        out.append(f"  … (+{len(items) - len(shown)}; 'hrag status --json' lists all)")
    return out


def index_lines(summary: dict[str, Any], graph: dict[str, Any] | None, seconds: float) -> list[str]:
    """The summary of `hrag index`. `graph`: the resolve stage's counts when this run did not rebuild it."""
    lines: list[str] = []
    chunk = summary.get("chunk")
    if isinstance(chunk, dict):
        lines.append(files_line(chunk))
        lines.append(f"chunks: {chunk.get('chunks', 0)} ({chunk.get('new_chunks', 0)} new, "
                     f"{chunk.get('removed_chunks', 0)} removed)")
    extract = summary.get("extract")
    if isinstance(extract, dict):
        if "stopped" in extract:
            lines.append(f"extraction stopped: {extract['stopped']}")
        else:
            part = f"extraction: {extract.get('extracted_now', 0)} chunks now, {extract.get('cached', 0)} cached"
            for key, word in (("failed", "failed"), ("partial", "partial"), ("pending", "pending")):
                if extract.get(key):
                    part += f", {extract[key]} {word}"
            if extract.get("cost"):
                part += f", ${extract['cost']:.4f}"
            lines.append(part)
    resolve = summary.get("resolve")
    counts = resolve if isinstance(resolve, dict) else graph
    if isinstance(counts, dict) and "entities" in counts:
        changed = "" if isinstance(resolve, dict) else " (unchanged)"
        lines.append(f"graph: {counts.get('entities', 0)} entities, {counts.get('relations', 0)} relations{changed}")
    if "estimate" in summary and isinstance(summary["estimate"], dict):
        lines.append("estimate: " + ", ".join(f"{k} {v}" for k, v in summary["estimate"].items()))
    lines.append(f"time: {seconds:.1f} s")
    if isinstance(chunk, dict) and chunk.get("skipped"):
        lines.append("not indexed:")
        lines.extend(skipped_lines(chunk))
    return lines

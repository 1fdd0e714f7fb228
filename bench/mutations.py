"""Does the test net catch the bugs a nightly job would meet? Plants known bugs, one at a time, in a temporary
copy of the code (never in the working tree) and runs the test files that should catch each one.

Scope: the exit codes, the chunk stage's change detection, the `--max-cost` budget, the query's citations and
the dry-run estimate; each mutation is one small edit a refactor could plausibly make.

    .venv/bin/python bench/mutations.py                 # every mutation, one table
    .venv/bin/python bench/mutations.py --list          # the mutations and their test files, nothing run
    .venv/bin/python bench/mutations.py --only budget-reached-is-not-exceeded citations-repeated
    .venv/bin/python bench/mutations.py --baseline      # first check the unmutated copy passes those files

Prints one row per mutation: the first test that failed on it, or SURVIVED, and the seconds it took. Exits 1
when any mutation survived (or the baseline failed), so it can gate a change to these modules.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str                               # file under the repository root
    edits: tuple[tuple[str, str], ...]      # (old, new): each old text must occur exactly once
    tests: tuple[str, ...]                  # test files run against it
    bug: str                                # what the planted bug does, in a user's words


def _m(name: str, path: str, old: str, new: str, tests: tuple[str, ...], bug: str) -> Mutation:
    return Mutation(name, path, ((old, new),), tests, bug)


EXIT = ("tests/test_integrity.py",)
LLM_RUNS = ("tests/test_llm_runs.py", "tests/test_local_answers.py")
CHUNK = ("tests/test_append.py", "tests/test_documents.py")
QUERY = ("tests/test_query_cli.py",)

MUTATIONS: tuple[Mutation, ...] = (
    # -- exit codes
    _m("partial-chunks-exit-0", "hrag_cli/pipeline.py",
       'bad = counts.get("failed", 0) + counts.get("partial", 0)', 'bad = counts.get("failed", 0)',
       LLM_RUNS, "a run whose chunks came back partial exits 0"),
    _m("nothing-extracted-exits-4", "hrag_cli/pipeline.py",
       "return EXIT_FAILED if usable <= 0 and", "return EXIT_FAILED if usable < 0 and",
       LLM_RUNS, "a run that extracted not one chunk exits 4 instead of 1"),
    _m("unreadable-answer-is-ok", "hrag_cli/extract/llm_extractor.py",
       "failed = bool(error) or (empty and is_nontrivial(chunk.text) and not clean_nothing)",
       "failed = bool(error)",
       ("tests/test_local_answers.py",), "an answer with no usable rows is recorded ok (the run exits 0)"),
    _m("budget-stop-exit-1", "hrag_cli/core/errors.py", "EXIT_BUDGET = 3", "EXIT_BUDGET = 1",
       EXIT, "a --max-cost stop exits 1 like a failure"),
    _m("usage-error-exit-1", "hrag_cli/core/errors.py", "EXIT_USAGE = 2", "EXIT_USAGE = 1",
       EXIT, "bad usage exits 1 like a failure"),
    _m("project-locked-exit-2", "hrag_cli/core/errors.py", "EXIT_TEMPFAIL = 75", "EXIT_TEMPFAIL = 2",
       EXIT, "a run that finds another one holding the project exits 2 like a wrong command"),
    _m("ctrl-c-loses-its-message", "hrag_cli/cli.py", "if rc == 130:", "if rc == 131:",
       EXIT, "Ctrl-C exits without saying how to resume"),
    _m("ctrl-c-waits-for-requests", "hrag_cli/extract/stage.py",
       "            for fut in running:\n                fut.cancel()\n", "",
       ("tests/test_index_e2e.py",), "Ctrl-C mid-extraction waits for every request in flight to be answered"),
    # -- the chunk stage's change detection
    _m("deleted-old-file-kept", "hrag_cli/chunk/stage.py",
       "if set(scanned.unchanged) != stamps.keys() or not isinstance(",
       "if not isinstance(",
       CHUNK, "a days-old file deleted with nothing new added keeps its documents and chunks"),
    _m("stamp-without-ctime", "hrag_cli/chunk/documents.py",
       "return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns]",
       "return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]",
       CHUNK, "a file edited in place with its size kept and mtime set back is not read again"),
    _m("changed-document-keeps-old-chunks", "hrag_cli/chunk/stage.py",
       "if reuse and old is not None and old.sha256 == doc.sha256:", "if reuse and old is not None:",
       CHUNK, "a changed document keeps its previous chunks"),
    _m("new-text-already-held-is-appended", "hrag_cli/chunk/stage.py",
       "if used and (taken is None or taken(used)):", "if used and taken is None:",
       CHUNK, "a new file repeating a text the project holds is appended, with ids a fresh build would not give"),
    _m("unstamped-file-changed-is-appended", "hrag_cli/chunk/stage.py",
       " \\\n            or any(before[item.doc.doc_id] != item.doc.sha256 for item in again):", ":",
       CHUNK, "a recent file read again and changed is appended instead of replaced"),
    # -- the budget
    _m("budget-reached-is-not-exceeded", "hrag_cli/core/llm.py",
       "if self.max_cost is not None and self.stats.cost >= self.max_cost:",
       "if self.max_cost is not None and self.stats.cost > self.max_cost:",
       ("tests/test_llm.py", "tests/test_integrity.py"), "--max-cost 0 still sends a request"),
    _m("budget-not-checked-after-waiting", "hrag_cli/core/llm.py",
       "            self._check_budget()  # the spend may have reached the limit while this request waited",
       "            pass  # the spend may have reached the limit while this request waited",
       ("tests/test_llm.py",), "requests queued behind the one that reached the budget are still sent"),
    # -- the query's citations
    _m("citations-repeated", "hrag_cli/query/run.py",
       "if 1 <= n <= len(r.chunks) and n not in cited:", "if 1 <= n <= len(r.chunks):",
       QUERY, "a passage cited twice is listed twice"),
    _m("last-passage-not-citable", "hrag_cli/query/run.py",
       "if 1 <= n <= len(r.chunks) and n not in cited:", "if 1 <= n < len(r.chunks) and n not in cited:",
       QUERY, "a citation of the last passage is dropped"),
    _m("citations-sorted", "hrag_cli/query/run.py", "for n in cited]}", "for n in sorted(cited)]}",
       QUERY, "citations lose the order the answer gave them"),
    # -- the dry-run estimate
    Mutation("completion-ratios-swapped", "hrag_cli/extract/estimate.py",
             (("COMPLETION_RATIO = 1.5", "COMPLETION_RATIO = 0.8"),
              ("GLEAN_COMPLETION_RATIO = 0.8", "GLEAN_COMPLETION_RATIO = 1.5")),
             ("tests/test_llm_runs.py",), "the first answer and the gleaning round swap their completion ratios"),
    _m("first-answer-ratio-off", "hrag_cli/extract/estimate.py", "COMPLETION_RATIO = 1.5\n", "COMPLETION_RATIO = 1.4\n",
       ("tests/test_llm_runs.py",), "the first answer's completion ratio drifts"),
    _m("estimate-counts-gleaning-for-every-chunk", "hrag_cli/extract/estimate.py",
       "for _ in range(glean_rounds_for(ch, settings.extract)):", "for _ in range(settings.extract.max_gleanings):",
       ("tests/test_index_e2e.py",), "the estimate counts a gleaning round for chunks too small to get one"),
)


def _apply(text: str, m: Mutation) -> str:
    for old, new in m.edits:
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"mutation {m.name}: {old!r} occurs {n} times in {m.path}, not once: update it")
        text = text.replace(old, new)
    return text


def _copy_tree(dst: Path) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored files), with the virtual environment
    linked in: `.venv/bin/hrag` and the interpreter are the project's own."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    (dst / ".venv").symlink_to(ROOT / ".venv", target_is_directory=True)


def _env(copy: Path) -> dict:
    # the copy's hrag_cli ahead of the editable install (whose finder comes after sys.path), in subprocesses too
    return {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}


def _pytest(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, str, float]:
    """(verdict, first failed test, seconds): verdict caught / SURVIVED / error / timeout."""
    cmd = [str(copy / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=_env(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.monotonic() - t0
    took = time.monotonic() - t0
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    if proc.returncode == 0:
        return "SURVIVED", "", took
    if proc.returncode == 1:
        return "caught", failed[0] if failed else "", took
    return "error", (failed[0] if failed else proc.stdout.strip().splitlines()[-1:] or [""])[0], took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="these mutations (names from --list)")
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--baseline", action="store_true", help="first run the test files on the unmutated copy")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per test run (default 900)")
    ap.add_argument("--json", action="store_true", help="one JSON object per mutation instead of the table")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if args.only is None or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTATIONS}
    if unknown:
        raise SystemExit(f"unknown mutation(s): {', '.join(sorted(unknown))} (see --list)")
    if args.list:
        for m in chosen:
            print(f"{m.name:42} {m.path:34} {' '.join(m.tests)}\n{'':42} {m.bug}")
        return 0
    for m in chosen:            # every planted edit still matches the code and compiles, before anything runs
        try:
            compile(_apply((ROOT / m.path).read_text(encoding="utf-8"), m), m.path, "exec")
        except SyntaxError as exc:
            raise SystemExit(f"mutation {m.name} does not compile ({exc.msg}, line {exc.lineno}): fix its edit")

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hrag-mutations-") as tmp:
        copy = Path(tmp) / "repo"
        _copy_tree(copy)
        where = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c", "import hrag_cli; print(hrag_cli.__file__)"],
                               cwd=copy, env=_env(copy), capture_output=True, text=True, check=True).stdout.strip()
        if not where.startswith(str(copy)):
            raise SystemExit(f"the copy's hrag_cli is not the one imported ({where}): cannot plant bugs there")
        failed_baseline = False
        if args.baseline:
            files = tuple(sorted({t for m in chosen for t in m.tests}))
            verdict, first, took = _pytest(copy, files, args.timeout * 2)
            print(f"baseline: {'passed' if verdict == 'SURVIVED' else 'FAILED ' + first} ({took:.0f} s, "
                  f"{len(files)} files)", flush=True)
            failed_baseline = verdict != "SURVIVED"
        if not args.json:
            print(f"| mutation | module | planted bug | result | first failing test | s |\n|---|---|---|---|---|---|",
                  flush=True)
        for m in chosen:
            target = copy / m.path
            original = target.read_text(encoding="utf-8")
            target.write_text(_apply(original, m), encoding="utf-8")
            try:
                verdict, first, took = _pytest(copy, m.tests, args.timeout)
            finally:
                target.write_text(original, encoding="utf-8")
            row = {"mutation": m.name, "module": m.path, "bug": m.bug, "result": verdict, "caught_by": first,
                   "seconds": round(took, 1), "tests": list(m.tests)}
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"| {m.name} | {m.path.removeprefix('hrag_cli/')} | {m.bug} | {verdict} | {first} | "
                      f"{took:.0f} |", flush=True)
    caught = sum(r["result"] != "SURVIVED" for r in rows)
    print(f"{caught} of {len(rows)} planted bugs caught; "
          f"{sum(r['seconds'] for r in rows):.0f} s of test runs", file=sys.stderr)
    return 1 if failed_baseline or caught < len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Prints the damage matrix (every project file x truncate/empty/delete/zero -> status, query, index) over
sample_corpus. Figures, not pass/fail: `python bench/damage_matrix.py [--work DIR]`."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness import ROOT

from hrag_cli.core import offline

offline.setup()
from tests.damage import DAMAGES, build, matrix  # noqa: E402  (after the offline set-up)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--files", nargs="*", default=None, help="only these project files")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="hrag-damage-"))
    built = work / "built"
    base = build(built, ROOT / "sample_corpus")
    res = matrix(built, work, base, args.files, docs=(str(ROOT / "sample_corpus"),))
    files = sorted({f for f, _ in res})
    print(f"{'file':42} " + " ".join(f"{d:32}" for d in DAMAGES))
    bad = 0
    for f in files:
        cells = []
        for d in DAMAGES:
            r = res[(f, d)]
            cells.append("n/a" if not r else f"{r['status']}/{r['query']}/{r['index']}")
            bad += bool(r) and (r["query"] == "WRONG" or r["index"] != "restored")
        print(f"{f:42} " + " ".join(f"{c:32}" for c in cells))
    print("cell = status/query/index: status clean|flags|error; query same|refuseN|WRONG (exit 0, other "
          "answers); index restored = a plain 'hrag index -p P' brings back the undamaged answers "
          "(restored-with-DOCS = only 'hrag index DOCS -p P' did: counted as not restored)")
    print(f"cases: {sum(1 for r in res.values() if r)}  wrong-answer or not-restored: {bad}")


if __name__ == "__main__":
    main()

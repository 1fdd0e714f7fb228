"""Query cost on a built project: cold `hrag query` processes and one batch process, per mode.

Prints per mode: the cold query's wall, CPU (user + system) and peak RSS (medians of --cold fresh processes,
the first question of the file), the batch's p50 of `timings.total_ms` and of each step (embed, bm25, seed,
ppr, ...) over every question of the file in one `hrag query --file` process, and that process's CPU and
peak RSS. Read-only: the project is never written.

    .venv/bin/python bench/query_scale.py --project P --queries Q.txt --modes ppr,naive,hybrid,mix
    .venv/bin/python bench/query_scale.py --project P --queries Q.txt --cold 3 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from harness import measured


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2) if xs else 0.0


def measure(project: Path, queries: Path, mode: str, cold: int) -> dict:
    first = next(q.strip() for q in queries.read_text(encoding="utf-8").splitlines() if q.strip())
    colds = [measured("query", first, "--mode", mode, "--json", "-p", str(project)) for _ in range(cold)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "batch.jsonl"
        batch = measured("query", "--file", str(queries), "--mode", mode, "--json", "-p", str(project), stdout_path=out)
        timings = [json.loads(x)["timings"] for x in out.read_text(encoding="utf-8").splitlines() if x.strip()]
    steps = sorted({k for t in timings for k in t})
    return {"mode": mode,
            "cold": {k: _median([c[k] for c in colds]) for k in ("wall_s", "cpu_s", "peak_rss_mb")},
            "batch": {"queries": len(timings), "cpu_s": batch["cpu_s"], "peak_rss_mb": batch["peak_rss_mb"],
                      **{f"p50_{k}": _median([t[k] for t in timings if k in t]) for k in steps}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--queries", type=Path, required=True, help="one question per line")
    ap.add_argument("--modes", default="ppr")
    ap.add_argument("--cold", type=int, default=3, help="fresh processes per mode for the cold figures")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(args.project, args.queries, m.strip(), args.cold) for m in args.modes.split(",") if m.strip()]
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        c, b = r["cold"], r["batch"]
        steps = "  ".join(f"{k[4:]} {v}" for k, v in b.items() if k.startswith("p50_") and k != "p50_total_ms")
        print(f"{r['mode']:>7}  cold {c['wall_s']} s wall, {c['cpu_s']} s CPU, {c['peak_rss_mb']} MB | batch of "
              f"{b['queries']}: p50 {b.get('p50_total_ms')} ms ({steps}), {b['cpu_s']} s CPU, {b['peak_rss_mb']} MB")


if __name__ == "__main__":
    main()

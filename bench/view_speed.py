"""`hrag view` on a real project: page size, and how soon the page is interactive in headless Chromium.

Default project: 2WikiMultiHopQA's 6,119 passages indexed with the rules extractor and the builtin embedder
(bench/retrieval.py's 2wiki-rules project, built under --work unless it is there), drawn as its 2,000 most
connected entities. Time to interactive = from the start of navigation to the first frame sigma draws with the
graph loaded (the page's `hragView.ready`, in performance.now() milliseconds), median of --runs fresh tabs; then
a search typed into the box and a click on its first result are timed too.

    .venv/bin/python bench/view_speed.py                      # build (first time ~14 CPU-minutes) and measure
    .venv/bin/python bench/view_speed.py --project DIR --max-nodes 2000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import hrag, parse_args
from tests.browser import Chromium, file_url, find_chromium


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, default=None, help="an indexed project (default: the 2wiki-rules one)")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("HRAG_RETRIEVAL_WORK", Path(tempfile.gettempdir()) / "hrag-retrieval")))
    ap.add_argument("--max-nodes", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    args = parse_args(ap)
    if find_chromium() is None:
        sys.exit("chromium is not installed (make setup-browser)")
    project = args.project
    if project is None:
        from retrieval import build

        project, _ = build("2wiki-rules", "builtin", args.work / "2wiki-rules-builtin", lambda m: print(m, flush=True))

    out = Path(tempfile.mkdtemp(prefix="hrag-view-")) / "graph.html"
    run = hrag("view", "-p", project, "-o", out, "--max-nodes", str(args.max_nodes), "--json")
    size = out.stat().st_size
    print(f"hrag view --max-nodes {args.max_nodes}: {run.wall_s:.1f} s wall, {run.cpu_s:.1f} CPU s, peak RSS "
          f"{run.peak_rss_mb:.0f} MB; {run.stdout.strip()}")
    print(f"file: {size / 1e6:.2f} MB ({size:,} bytes)")

    ready, search, click = [], [], []
    marks: list[dict[str, float]] = []
    with Chromium.start() as browser:
        for _ in range(args.runs):
            page = browser.open(file_url(out))
            ready.append(page.wait_for("window.hragView && window.hragView.ready", timeout=120))
            marks.append(page.evaluate("Object.fromEntries(performance.getEntriesByType('mark')"
                                       ".map(m => [m.name.slice(5), m.startTime]))"))
            nodes, edges = page.evaluate("[hragView.nodes, hragView.edges]")
            name = page.evaluate("hragView.graph.getNodeAttribute('0', 'label')")
            t = time.perf_counter()
            page.type_text("#search", name)
            page.wait_for("document.getElementById('results').dataset.count > 0")
            search.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            page.evaluate("document.querySelector('#results li').click()")
            page.wait_for("document.getElementById('details').dataset.node")
            click.append((time.perf_counter() - t) * 1000)
            browser.pump(0.1)
            errors = page.errors()
            if errors:
                sys.exit(f"console errors: {errors}")
            page.send("Page.close")
    print(f"page: {nodes:,} nodes, {edges:,} edges")
    print(f"time to interactive (navigation start -> first frame drawn): median {statistics.median(ready):.0f} ms "
          f"(runs: {', '.join(f'{r:.0f}' for r in ready)})")
    steps = [("start", "HTML read, scripts compiled"), ("parsed", "data parsed"), ("graph", "graph built"),
             ("sigma", "renderer set up")]
    parts, before = [], 0.0
    for key, what in steps:
        at = statistics.median(m[key] for m in marks)
        parts.append(f"{what} {at - before:.0f}")
        before = at
    parts.append(f"first frame {statistics.median(ready) - before:.0f}")
    print("  where it goes (median ms): " + ", ".join(parts))
    print(f"search typed -> results: median {statistics.median(search):.0f} ms; "
          f"click -> details: median {statistics.median(click):.0f} ms (both include the DevTools round trips)")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()

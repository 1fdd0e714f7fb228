"""hrag view: the page holds the graph it says it holds, opens with no network, and works in a real browser
(headless Chromium over the DevTools protocol: no console errors, the counts the page reports equal the
graph's, a search finds a node, a click shows its details, the screenshot is not blank)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.export.run import load_export_graph, select_subgraph
from hrag_cli.graph.model import load_graph
from hrag_cli.view.page import ViewOptions, run_view
from tests.browser import Chromium, file_url, find_chromium, png_pixels
from tests.test_export import index_sample, make_tricky_project

ROOT = Path(__file__).resolve().parent.parent
HRAG = [sys.executable, "-m", "hrag_cli.cli"]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> ProjectDir:
    return index_sample(tmp_path_factory.mktemp("viewsample") / "proj")


@pytest.fixture(scope="module")
def sample_page(sample: ProjectDir, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("page") / "graph.html"
    return out, run_view(sample, ViewOptions(output=out))


def page_data(path: Path) -> dict:
    html = path.read_text(encoding="utf-8")
    blob = re.search(r'<script type="application/json" id="hrag-data">(.*?)</script>', html, re.S)
    assert blob is not None
    return json.loads(blob.group(1))


def test_page_holds_the_whole_small_graph(sample: ProjectDir, sample_page: tuple[Path, dict]) -> None:
    out, summary = sample_page
    g, _ = load_graph(sample)
    data = page_data(out)
    assert summary["nodes"] == len(data["nodes"]["id"]) == g.vcount()
    assert summary["edges"] == len(data["edges"]["s"]) == g.ecount()
    assert "shown" not in summary and data["note"] == ""
    assert sorted(k["name"] for k in data["edgeKinds"] if k["count"]) == sorted(set(g.es["kind"]))
    assert {k["name"]: k["directed"] for k in data["edgeKinds"]}["SYNONYM"] is False
    index = {nid: i for i, nid in enumerate(data["nodes"]["id"])}
    chunks = {c["chunk_id"]: c for c in store.read_jsonl(sample.chunks_path)}
    docs = {d["doc_id"]: d["path"] for d in store.read_jsonl(sample.docs_path)}
    for ent in store.read_jsonl(sample.entities_path):
        i = index["entity:" + ent["id"]]
        info = data["info"][i]
        assert data["nodes"]["label"][i] == ent["name"] and info["t"] == ent["type"]
        assert info.get("d", "") == ent["description"] and info.get("a", []) == ent["aliases"]
        got = [data["chunks"][ci] for ci in info["c"]]
        want = [chunks[c] for c in ent["source_ids"]][:20]
        assert [(data["docs"][d], order) for d, order, _ in got] == [(docs[c["doc_id"]], c["order"]) for c in want]
        assert all(c["text"].startswith(snip.removesuffix(" …")) for (_, _, snip), c in zip(got, want))
    xs, ys = data["nodes"]["x"], data["nodes"]["y"]
    assert len(set(zip(xs, ys))) > 0.9 * len(xs)                 # a layout, not a pile


def test_page_needs_no_network(sample_page: tuple[Path, dict]) -> None:
    html = sample_page[0].read_text(encoding="utf-8")
    assert re.search(r"<script[^>]*\bsrc=", html) is None
    assert re.findall(r"<link[^>]*href=\"([^\"]*)\"", html) == ["data:,"]
    assert "sourceMappingURL" not in html


def test_big_graph_shows_the_top_entities_and_select_works(sample: ProjectDir, tmp_path: Path) -> None:
    summary = run_view(sample, ViewOptions(output=tmp_path / "top.html", max_nodes=50))
    data = page_data(tmp_path / "top.html")
    full = load_export_graph(sample)
    top = select_subgraph(full, "top:50")
    assert summary["nodes"] == 50 == len(data["nodes"]["id"]) and summary["edges"] == len(top.edges)
    assert set(data["nodes"]["id"]) == {n.id for n in top.nodes}
    assert all(k == data["kinds"].index("Entity") for k in data["nodes"]["kind"])
    assert "most connected" in summary["shown"] and "most connected" in data["note"]
    # ranked on edges to other entities, then on edges of any kind
    linked: dict[str, int] = {}
    degree: dict[str, int] = {}
    for e in full.edges:
        for end in (e.source, e.target):
            degree[end] = degree.get(end, 0) + 1
            if e.type in ("RELATION", "SYNONYM"):
                linked[end] = linked.get(end, 0) + 1
    ranked = sorted((n.id for n in full.nodes if n.label == "Entity"),
                    key=lambda i: (-linked.get(i, 0), -degree.get(i, 0), i))
    assert set(data["nodes"]["id"]) == set(ranked[:50])
    assert linked.get(ranked[0], 0) > linked.get(ranked[60], 0)
    around = run_view(sample, ViewOptions(output=tmp_path / "a.html", select="entities,around:Port Ellery", hops=1))
    names = page_data(tmp_path / "a.html")["nodes"]["label"]
    assert "Port Ellery" in names and around["nodes"] == len(names) < 50


def test_bad_usage(tmp_path: Path) -> None:
    project = make_tricky_project(tmp_path / "proj")
    with pytest.raises(UsageError, match="inside the project"):
        run_view(project, ViewOptions(output=project.root / "g.html"))
    with pytest.raises(UsageError, match="is a folder"):
        run_view(project, ViewOptions(output=tmp_path))
    with pytest.raises(UsageError, match="top:N"):
        run_view(project, ViewOptions(output=tmp_path / "g.html", select="top:many"))
    with pytest.raises(UsageError, match="did you mean"):
        run_view(project, ViewOptions(output=tmp_path / "g.html", select="around:Port Elery"))
    assert not (tmp_path / "g.html").exists()


def test_cli_open_hands_the_page_to_the_browser(tmp_path: Path) -> None:
    """--open goes through the webbrowser module, which runs $BROWSER when it is set."""
    project = make_tricky_project(tmp_path / "proj")
    seen = tmp_path / "seen.txt"
    fake = tmp_path / "browser.sh"
    fake.write_text(f'#!/bin/sh\necho "$1" > "{seen}"\n')
    fake.chmod(0o755)
    env = {**os.environ, "BROWSER": str(fake)}
    run = subprocess.run(HRAG + ["view", "-p", str(project.root), "--open", "--json"], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["output"] == "graph.html" and summary["opened"] is True
    assert seen.read_text().strip() == (tmp_path / "graph.html").resolve().as_uri()


# -- in a real browser -------------------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(find_chromium() is None,
                                    reason="chromium is not installed (apt-get install chromium; make setup does it)")


@needs_chromium
def test_page_in_headless_chromium(sample: ProjectDir, sample_page: tuple[Path, dict]) -> None:
    out, summary = sample_page
    g, _ = load_graph(sample)
    with Chromium.start() as browser:
        page = browser.open(file_url(out))
        page.wait_for("window.hragView && window.hragView.ready")
        counts = page.evaluate("[hragView.nodes, hragView.edges, document.getElementById('stats').dataset.nodes, "
                               "document.getElementById('stats').dataset.edges]")
        assert counts == [g.vcount(), g.ecount(), str(g.vcount()), str(g.ecount())]
        assert page.evaluate("document.getElementById('legend').innerText").count("RELATION") == 1

        page.type_text("#search", "port ellery")
        page.wait_for("document.getElementById('results').dataset.count > 0")
        first = page.evaluate("document.querySelector('#results li').firstChild.textContent")
        assert first == "Port Ellery"
        page.evaluate("document.querySelector('#results li').click()")
        page.wait_for("document.getElementById('details').dataset.node")
        details = page.evaluate("document.getElementById('details').innerText")
        assert "Port Ellery" in details and "location" in details and "port_ellery" in details

        page.evaluate("hragView.select(null, false)")
        box = page.evaluate("(() => { const r = document.getElementById('graph').getBoundingClientRect(); "
                            "return [r.left, r.top, r.width, r.height]; })()")
        width, height, rows = png_pixels(page.screenshot(scale=0.25))
        bpp = len(rows[0]) // width
        x0, y0, x1, y1 = (int(v * 0.25) for v in (box[0], box[1], box[0] + box[2], box[1] + box[3]))
        graph_pixels = [row[x * bpp:x * bpp + 3] for row in rows[y0:y1] for x in range(x0, x1)]
        colours = {p for p in graph_pixels}
        drawn = sum(1 for p in graph_pixels if p != b"\xff\xff\xff")
        assert len(colours) > 20 and drawn > 0.01 * len(graph_pixels)   # nodes, edges and labels drawn
        browser.pump(0.2)
        assert page.errors() == []


def test_layout_packs_components_apart() -> None:
    """Each connected component gets its own box: no two boxes overlap, and the biggest comes first (top)."""
    from hrag_cli.export.model import Edge, ExportGraph, Node
    from hrag_cli.view.page import layout

    nodes = [Node(f"entity:{i}", "Entity", {"name": str(i)}) for i in range(40)]
    ring = [Edge(f"entity:{i}", f"entity:{(i + 1) % 20}", "RELATION", {}) for i in range(20)]
    pair = [Edge("entity:20", "entity:21", "SYNONYM", {}), Edge("entity:22", "entity:23", "RELATION", {})]
    pos = layout(ExportGraph(nodes, ring + pair))
    assert len(pos) == 40 and len(set(pos)) == 40
    groups = [range(0, 20), [20, 21], [22, 23]] + [[i] for i in range(24, 40)]
    boxes = [(min(pos[i][0] for i in g), min(pos[i][1] for i in g), max(pos[i][0] for i in g),
              max(pos[i][1] for i in g)) for g in groups]
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = boxes[a], boxes[b]
            assert ax1 < bx0 or bx1 < ax0 or ay1 < by0 or by1 < ay0, (a, b)
    assert boxes[0][3] == max(b[3] for b in boxes)          # the ring is on the first row, drawn at the top
    assert layout(ExportGraph(nodes, ring + pair)) == pos   # the same graph is drawn the same way

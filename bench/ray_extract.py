"""LLM-bound extraction, one process against a Ray cluster: chunks/s with the stub LLM answering each request
after --delay seconds (a provider's latency).

One process is bounded by its own requests in flight (--concurrency; 8 by default for a remote provider); on
a cluster the same flag is one cap for every node together, and requests leave from the nodes' workers. The
cluster here is a head and --nodes - 1 more nodes as processes on this machine (ray.cluster_utils.Cluster),
so it shows the cap and the fan-out, not more network or CPU than one machine has.

    python bench/ray_extract.py --chunks 1000 --delay 0.2 --cap 32
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

from harness import hrag
from tests.stub_server import StubServer
from tests.test_index_e2e import child_env, fake_extraction

WORDS = ["Mara", "Quint", "Tobiah", "Renn", "Ilse", "Varga", "Selby", "Harbour", "Calder", "Oldport"]


def corpus(folder: Path, n: int) -> Path:
    """n one-sentence documents, one chunk each (one request each with --max-gleanings 0)."""
    docs = folder / "docs"
    docs.mkdir(parents=True)
    for i in range(n):
        a, b = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)]
        (docs / f"d{i:06d}.txt").write_text(f"{a} Number{i} met {b} at the Selby Lighthouse in {1800 + i % 200}.")
    return docs


def extract_rate(docs: Path, proj: Path, stub: StubServer, extra: list[str]) -> tuple[int, float, float, float]:
    """(chunks, seconds the extract stage took by its own report, CPU seconds of the driver process, wall
    seconds of the whole command: start-up, chunking and connecting included)."""
    run = hrag("index", docs, "-p", proj, "--llm-model", "openai/stub-model", "--llm-api-base", stub.url,
               "--max-gleanings", "0", "--stop-after", "extract", *extra, env=child_env())
    m = re.findall(r"extract: (\d+)/\d+ in ([\d.]+)s", run.stderr)
    if not m:
        raise SystemExit(f"no extract timing in: {run.stderr[-2000:]}")
    return int(m[-1][0]), float(m[-1][1]), run.cpu_s, run.wall_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds the stub takes per request")
    ap.add_argument("--cap", type=int, default=32, help="requests in flight: the cluster-wide cap")
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the local cluster (head included)")
    args = ap.parse_args()

    # Ray starts its workers 15 steps nicer than their node: on a node of their own that costs nothing, but
    # here they share 2 cores with this script, the stub and other jobs, and would get what those leave
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray
    from ray.cluster_utils import Cluster

    def answer(body: dict) -> str:
        time.sleep(args.delay)
        return fake_extraction(body)

    with tempfile.TemporaryDirectory() as tmp, StubServer(record=False) as stub:
        stub.set_chat(answer)
        docs = corpus(Path(tmp), args.chunks)
        rows = []
        for label, extra in (("one process, --concurrency 8 (the default)", ["--concurrency", "8"]),
                             (f"one process, --concurrency {args.cap}", ["--concurrency", str(args.cap)])):
            n, secs, cpu, wall = extract_rate(docs, Path(tmp) / f"p{len(rows)}", stub, extra)
            rows.append((label, n, secs, wall, cpu, stub.max_in_flight))
            stub.reset()
            stub.set_chat(answer)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "object_store_memory": 80 * 2**20})
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()
        try:
            n, secs, cpu, wall = extract_rate(docs, Path(tmp) / "ray", stub,
                                              ["--ray", cluster.address, "--concurrency", str(args.cap)])
            rows.append((f"Ray, {args.nodes} nodes, cap {args.cap}", n, secs, wall, cpu, stub.max_in_flight))
        finally:
            ray.shutdown()
            cluster.shutdown()
    print(f"stub delay {args.delay * 1000:.0f} ms a request, {args.chunks} chunks, one request each")
    print(f"{'run':<44} {'chunks':>7} {'extract s':>10} {'chunks/s':>9} {'command s':>10} {'driver CPU s':>13} "
          f"{'max in flight':>14}")
    for label, n, secs, wall, cpu, peak in rows:
        print(f"{label:<44} {n:>7} {secs:>10.1f} {n / secs:>9.1f} {wall:>10.1f} {cpu:>13.1f} {peak:>14}")
    print("load average (1, 5, 15 min) at the end: " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()

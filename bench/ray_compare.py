"""The same corpus indexed by one process and on a local Ray cluster, with LLM extraction through the stub
server: the same index, a node lost mid-run, and a driver killed mid-run and run again.

The corpus is bench/scale.py's synthetic one (real 2Wiki and MuSiQue passages recombined, names renamed), the
questions its renamed 2Wiki questions. The stub answers each extraction request after --delay seconds with
the capitalised words of the passage as entities, each related to the next (tests/stub_server.py
fake_extraction), so both builds get the same answers. Four full `hrag index` runs (builtin embedder):

1. one process, `--concurrency CAP`;
2. the cluster (a head and --nodes - 1 more node processes on this machine), `--ray ADDRESS --concurrency CAP`;
3. the cluster again, its second node removed (its processes killed) once a third of the requests were sent;
4. the cluster again, the driver killed (SIGKILL) once half of the requests were sent, then the same command.

Checked: the same chunk, entity, relation and fact counts in all four; the same top 5 chunks (`--mode ppr`)
for every question in 1 and 2; in 4, no request whose answer was in cache/llm.jsonl when the driver died is
sent again (requests the stub saw twice are counted by their message hash). Driver CPU is the `hrag` process
alone: the node processes' own CPU is not in it.

    nice -n 5 .venv/bin/python bench/ray_compare.py --passages 20000 --delay 0.2 --cap 32
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from harness import Run, hrag, parse_args
from scale import items, load_real, queries, write_corpus
from tests.stub_server import StubServer, fake_extraction
from tests.test_index_e2e import child_env

from hrag_cli.core import store
from hrag_cli.core.project import fingerprint

KEYS = ("chunks", "entities", "relations", "facts")


class Responder:
    """The stub's chat answer after `delay` seconds, counting every request by its messages' hash (as
    cache/llm.jsonl records it); `trigger(n)` is called with the running count (a mid-run kill)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.sent: Counter[str] = Counter()
        self.trigger: Callable[[int], None] | None = None

    def reset(self, trigger: Callable[[int], None] | None = None) -> Counter[str]:
        with self.lock:
            sent, self.sent, self.trigger = self.sent, Counter(), trigger
        return sent

    def __call__(self, body: dict) -> str | dict:
        h = fingerprint(body["messages"])
        with self.lock:
            self.sent[h] += 1
            n, trigger = sum(self.sent.values()), self.trigger
        if trigger is not None:
            trigger(n)
        time.sleep(self.delay)
        return fake_extraction(body)


def once(at: int, act: Callable[[], None]) -> Callable[[int], None]:
    """A trigger that runs `act` in a thread of its own when the count first reaches `at`."""
    fired = threading.Event()

    def trigger(n: int) -> None:
        if n >= at and not fired.is_set():
            fired.set()
            threading.Thread(target=act, daemon=True).start()

    return trigger


def build(docs: Path, proj: Path, stub: StubServer, cap: int, extra: list[str], check: bool = True,
          on_start: Callable[[subprocess.Popen], None] | None = None) -> Run:
    return hrag("index", docs, "-p", proj, "--llm-model", "openai/stub-model", "--llm-api-base", stub.url,
                "--embed-model", "builtin", "--concurrency", str(cap), *extra, check=check, env=child_env(),
                on_start=on_start)


def extract_seconds(run: Run) -> float | None:
    m = re.findall(r"extract: \d+/\d+ in ([\d.]+)s", run.stderr)
    return float(m[-1]) if m else None


def top5(proj: Path, qfile: Path, out: Path, answer: Responder) -> list[list[str]]:
    """The top 5 chunk ids per question (the ppr mode's fact filter asks the stub too: not counted)."""
    hrag("query", "--file", qfile, "--mode", "ppr", "-p", proj, stdout_path=out, env=child_env())
    answer.reset()
    return [[c["chunk_id"] for c in json.loads(line)["chunks"][:5]]
            for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]


def row(label: str, run: Run, proj: Path, sent: Counter[str]) -> dict:
    secs = extract_seconds(run)
    it = items(proj)
    return {"run": label, **{k: it.get(k) for k in KEYS}, "extract_s": secs,
            "chunks_per_s": round(it["chunks"] / secs, 1) if secs else None, "command_s": round(run.wall_s, 1),
            "driver_cpu_s": round(run.cpu_s, 1), "requests": sum(sent.values()),
            "sent_twice": sum(c - 1 for c in sent.values() if c > 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=20000)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds the stub takes per request")
    ap.add_argument("--cap", type=int, default=32, help="requests in flight (one process; the cluster-wide cap)")
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the local cluster (head included)")
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--work", type=Path, default=None, help="folder for the corpus and projects (default: temporary)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parse_args(ap)

    # Ray starts its workers 15 steps nicer than their node: on a node of their own that costs nothing, but
    # here they share 2 cores with this script, the stub and other jobs, and would get what those leave
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray
    from ray.cluster_utils import Cluster

    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp, StubServer(record=False) as stub:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        real = load_real()
        docs = work / "docs"
        write_corpus(docs, real, 0, args.passages, as_is=False)
        qfile = work / "questions.txt"
        qfile.write_text("\n".join(queries(real, args.questions, as_is=False)) + "\n", encoding="utf-8")
        answer = Responder(args.delay)
        stub.set_chat(answer)
        rows, tops = [], {}

        one = build(docs, work / "one", stub, args.cap, [])
        rows.append(row(f"one process, --concurrency {args.cap}", one, work / "one", answer.reset()))
        tops["one"] = top5(work / "one", qfile, work / "one.jsonl", answer)
        total = rows[0]["requests"]

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "object_store_memory": 80 * 2**20})
        extra = [cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20) for _ in range(args.nodes - 1)]
        cluster.wait_for_nodes()
        on_ray = ["--ray", cluster.address]
        try:
            spread = build(docs, work / "ray", stub, args.cap, on_ray)
            rows.append(row(f"Ray, {args.nodes} nodes, cap {args.cap}", spread, work / "ray", answer.reset()))
            tops["ray"] = top5(work / "ray", qfile, work / "ray.jsonl", answer)

            if extra:
                answer.reset(once(total // 3, lambda: cluster.remove_node(extra.pop())))
                lost = build(docs, work / "node-lost", stub, args.cap, on_ray)
                rows.append(row("Ray, a node removed at 1/3", lost, work / "node-lost", answer.reset()))
                extra.append(cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20))
                cluster.wait_for_nodes()

            driver: list[subprocess.Popen] = []
            answer.reset(once(total // 2, lambda: driver[0].kill()))
            killed = build(docs, work / "driver-killed", stub, args.cap, on_ray, check=False, on_start=driver.append)
            if killed.returncode == 0:
                raise SystemExit("the driver finished before it was killed: use more --passages")
            before = answer.reset()
            cache = work / "driver-killed" / "cache"     # the driver's appends and the senders' journals
            answered = {r["messages_hash"] for path in [cache / "llm.jsonl", *(cache / "llm.journal").glob("*.jsonl")]
                        for r in store.read_jsonl(path) if isinstance(r, dict)}
            again = build(docs, work / "driver-killed", stub, args.cap, on_ray)
            after = answer.reset()
            resumed = row("Ray, driver killed at 1/2, same command again", again, work / "driver-killed", after)
            resumed["killed_run"] = {"requests": sum(before.values()), "answered_and_cached": len(answered),
                                     "command_s": round(killed.wall_s, 1), "driver_cpu_s": round(killed.cpu_s, 1)}
            resumed["repeated_answered"] = sum(1 for h in after if h in answered)
            resumed["repeated_unanswered"] = sum(1 for h in after if h in before and h not in answered)
            rows.append(resumed)
            ids = [r["chunk_id"] for r in store.read_jsonl(work / "driver-killed" / "cache" / "extractions.jsonl")]
            resumed["ledger_duplicates"] = len(ids) - len(set(ids))
        finally:
            ray.shutdown()
            cluster.shutdown()
    load.append(os.getloadavg())

    base = {k: rows[0][k] for k in KEYS}
    same_counts = [r["run"] for r in rows if {k: r[k] for k in KEYS} == base]
    same_top = sum(a == b for a, b in zip(tops["one"], tops["ray"]))
    result = {"passages": args.passages, "delay_s": args.delay, "cap": args.cap, "nodes": args.nodes,
              "rows": rows, "same_counts_as_one_process": same_counts, "questions": len(tops["one"]),
              "same_top5": same_top, "load_start": [round(x, 1) for x in load[0]],
              "load_end": [round(x, 1) for x in load[1]]}
    print(f"{args.passages} passages, stub delay {args.delay * 1000:.0f} ms a request, cap {args.cap}")
    print(f"{'run':<46} {'chunks':>7} {'entities':>9} {'relations':>10} {'facts':>8} {'extract s':>10} "
          f"{'chunks/s':>9} {'command s':>10} {'driver CPU s':>13} {'requests':>9} {'sent twice':>11}")
    for r in rows:
        print(f"{r['run']:<46} {r['chunks']:>7} {r['entities']:>9} {r['relations']:>10} {r['facts']:>8} "
              f"{r['extract_s'] or 0:>10.1f} {r['chunks_per_s'] or 0:>9.1f} {r['command_s']:>10.1f} "
              f"{r['driver_cpu_s']:>13.1f} {r['requests']:>9} {r['sent_twice']:>11}")
    print(f"same chunk, entity, relation and fact counts as one process: {len(same_counts)} of {len(rows)} runs")
    print(f"same top 5 (ppr) as one process: {same_top} of {len(tops['one'])} questions")
    k = rows[-1]
    print(f"driver killed after {k['killed_run']['requests']} requests ({k['killed_run']['answered_and_cached']} "
          f"answered and cached): the rerun sent {k['requests']}, {k['repeated_answered']} of them answered "
          f"before, {k['repeated_unanswered']} in flight at the kill; ledger duplicates {k['ledger_duplicates']}")
    print("load average (1, 5, 15 min) at the start: " + ", ".join(map(str, result["load_start"]))
          + "; at the end: " + ", ".join(map(str, result["load_end"])))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""`hrag index --ray`: extraction on a real Ray cluster of two nodes on 127.0.0.1 (ray.cluster_utils.Cluster),
against the stub LLM server. The same index as one process; a node lost mid-run costs nothing; a driver
killed mid-run is resumed by the same command without asking anything that was answered; and without
--ray nothing imports Ray at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.core.project import ProjectDir, fingerprint
from tests.stub_server import StubReply, StubServer
from tests.test_index_e2e import CHAT, HRAG, SAMPLE, child_env, fake_extraction, run, summary
from tests.test_llm_runs import corpus

QUESTIONS = ["Who founded the institute that warned of the Great Flood of 1987?",
             "Which museum holds the bronze astrolabe?", "Where was the lighthouse built?",
             "Who led the expedition to the northern glacier?", "What did the harbour trust build?"]


# ------------------------------------------------------------------------------------------ without Ray


def _no_ray_after(args: list[str]) -> str:
    """Python code that runs `hrag ARGS` in-process and exits 3 if anything imported ray."""
    return ("import sys\nfrom hrag_cli.cli import main\n"
            f"sys.argv = ['hrag', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\nelse:\n    code = 0\n"
            "ray = [m for m, mod in sys.modules.items() if mod is not None and (m == 'ray' or m.startswith('ray.'))]\n"
            "sys.exit(3 if ray else code or 0)\n")


def test_index_and_query_never_import_ray_without_the_flag(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    for args in (["index", str(SAMPLE / "people"), "-p", str(proj), "--extractor", "rules", "--quiet"],
                 ["query", "Who founded the institute?", "-p", str(proj), "--json"]):
        proc = subprocess.run([sys.executable, "-c", _no_ray_after(args)], capture_output=True, text=True,
                              env=child_env(), timeout=120)
        assert proc.returncode == 0, (args[0], proc.returncode, proc.stderr[-2000:])


def test_ray_flag_without_ray_installed_is_one_line_with_the_fix(tmp_path: Path) -> None:
    """Ray made unimportable (sys.modules['ray'] = None): a usage error before anything is written."""
    proj = tmp_path / "proj"
    code = "import sys\nsys.modules['ray'] = None\n" + _no_ray_after(
        ["index", str(SAMPLE / "people"), "-p", str(proj), "--extractor", "rules", "--ray", "auto"])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Ray is not installed" in lines[0] and "pip install 'hrag[ray]'" in lines[0]
    assert not (proj / "cache").exists()


# ------------------------------------------------------------------------------------------ on a cluster


@pytest.fixture(scope="module")
def cluster():
    """A head node and one more, each with one CPU, and this process connected as a driver."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # Ray runs workers 15 steps nicer than their node; on a busy CI machine they would starve next to the stub
    os.environ.setdefault("RAY_worker_niceness", "0")

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * 2**20,
                                                      "include_dashboard": False})
    worker = c.add_node(num_cpus=1, object_store_memory=80 * 2**20)
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    c.wait_for_nodes()
    c.extra_node = worker
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def llm_args(docs: Path, proj: Path, stub: StubServer, *extra: str) -> list[str]:
    return ["index", str(docs), "-p", str(proj), "--llm-model", "openai/stub-model", "--llm-api-base", stub.url,
            "--json", *extra]


ONE_ROUND = ("--max-gleanings", "0", "--stop-after", "extract")


def slowly(seconds: float):
    """The stub's extraction answer, after `seconds`."""
    def answer(body: dict) -> str:
        time.sleep(seconds)
        return fake_extraction(body)

    return answer


def top5(proj: Path, question: str) -> list[str]:
    proc = run(["query", question, "-p", str(proj), "--json"], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    return [c["chunk_id"] for c in json.loads(proc.stdout)["chunks"][:5]]


@pytest.mark.ray
def test_the_cluster_builds_the_same_index_as_one_process(cluster, stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    alone, spread = tmp_path / "alone", tmp_path / "spread"
    one = run(llm_args(SAMPLE, alone, stub), inprocess=True)
    assert one.returncode == 0, one.stderr
    asked = stub.count(CHAT)
    two = run(llm_args(SAMPLE, spread, stub, "--ray", cluster.address), inprocess=True)
    assert two.returncode == 0, two.stderr
    a, b = summary(one), summary(two)
    # the same requests (extraction, then resolve's description summaries) as the process alone
    assert stub.count(CHAT) == 2 * asked and a["extract"]["llm_requests"] == b["extract"]["llm_requests"] > 0
    for stage, keys in (("extract", ("chunks", "entity_mentions", "relation_mentions", "failed", "pending")),
                        ("resolve", ("entities", "relations", "facts"))):
        assert {k: a[stage].get(k) for k in keys} == {k: b[stage].get(k) for k in keys}, stage
    assert b["resolve"]["entities"] > 0 and b["resolve"]["facts"] > 0
    # the setting is remembered: a plain run of the same project extracts on the cluster again, asking nothing
    again = run(["index", "-p", str(spread), "--json"], inprocess=True)
    assert again.returncode == 0 and stub.count(CHAT) == 2 * asked, again.stderr
    assert ProjectDir(spread).remembered()["cluster.ray"] == cluster.address
    assert [top5(alone, q) for q in QUESTIONS] == [top5(spread, q) for q in QUESTIONS]


@pytest.mark.ray
def test_rules_extraction_on_the_cluster_matches_one_process(cluster, tmp_path: Path) -> None:
    base = ["--extractor", "rules", "--stop-after", "extract", "--json"]
    one = run(["index", str(SAMPLE), "-p", str(tmp_path / "a"), *base], inprocess=True)
    two = run(["index", str(SAMPLE), "-p", str(tmp_path / "b"), *base, "--ray", cluster.address], inprocess=True)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    recs = [list(store.read_jsonl(tmp_path / p / "cache" / "extractions.jsonl")) for p in ("a", "b")]
    assert recs[0] == recs[1] and len(recs[0]) == summary(one)["extract"]["chunks"]


@pytest.mark.ray
def test_the_cap_holds_across_the_cluster(cluster, stub, tmp_path: Path) -> None:
    """--concurrency is one cap for every node together, reached and never passed."""
    docs, proj = corpus(tmp_path, n=6)
    stub.set_chat(slowly(0.5))
    proc = run(llm_args(docs, proj, stub, "--ray", cluster.address, "--concurrency", "3", *ONE_ROUND), inprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert stub.max_in_flight == 3 and stub.count(CHAT) == 6


@pytest.mark.ray
def test_a_429_pauses_every_node(cluster, stub, tmp_path: Path) -> None:
    """One refused request (Retry-After 3 s) pauses the senders of both nodes, not only the refused one:
    nothing is sent during the pause (a sender on its own would go on every 0.2 s), then every chunk is done."""
    docs, proj = tmp_path / "docs", tmp_path / "proj"
    docs.mkdir()
    for i in range(12):
        (docs / f"d{i}.txt").write_text(f"Keeper{i} Quint built the Selby Lighthouse for the Harbour Trust in 19{i:02d}.")
    arrivals: list[float] = []

    def answer(body: dict) -> str:
        arrivals.append(time.monotonic())
        time.sleep(0.2)
        return fake_extraction(body)

    stub.set_chat(answer)
    stub.enqueue(CHAT, StubReply(429, content="slow down", headers={"Retry-After": "3"}))
    proc = run(llm_args(docs, proj, stub, "--ray", cluster.address, "--concurrency", "4", *ONE_ROUND), inprocess=True)
    assert proc.returncode == 0, proc.stderr
    ex = summary(proc)["extract"]
    assert ex["extracted_now"] == 12 and ex["failed"] == 0 and stub.count(CHAT) == 13
    first = min(arrivals)       # the refused request came first (a scripted reply is served first)
    assert [round(t - first, 2) for t in arrivals if first + 0.5 < t < first + 2.5] == []


@pytest.mark.ray
def test_a_node_lost_mid_run_costs_only_its_requests_in_flight(cluster, stub, tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, n=6)
    gate = threading.Event()

    def slow(body: dict) -> str:
        if stub.count(CHAT) >= 3:
            gate.set()
        time.sleep(0.3)
        return fake_extraction(body)

    stub.set_chat(slow)
    # a driver process of its own: this one's stdout would take in what removing a node prints
    driver = subprocess.Popen([HRAG, *llm_args(docs, proj, stub, "--ray", cluster.address, "--concurrency", "2",
                                               *ONE_ROUND)],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert gate.wait(120)
        cluster.remove_node(cluster.extra_node)      # the second node's processes are killed
        out, err = driver.communicate(timeout=180)
        assert driver.returncode == 0, err
        assert out.startswith("{"), out[:2000]
        ex = json.loads(out)["extract"]
        assert ex["pending"] == 0 and ex["failed"] == 0 and ex["extracted_now"] == 6
    finally:
        if driver.poll() is None:
            driver.kill()
        cluster.extra_node = cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()


@pytest.mark.ray
def test_a_killed_driver_is_resumed_without_asking_anything_answered(cluster, stub, tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, n=6)
    stub.set_chat(slowly(0.3))
    args = llm_args(docs, proj, stub, "--ray", cluster.address, "--concurrency", "1", *ONE_ROUND)
    driver = subprocess.Popen([HRAG, *args], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 120
        while stub.count(CHAT) < 3 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.05)
        driver.kill()
        driver.communicate(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert stub.count(CHAT) >= 3, "the driver never reached its third request"
    # what the driver appended, and what the senders journaled but had not handed back yet
    answered = {rec["messages_hash"] for path in [proj / "cache" / "llm.jsonl",
                                                  *(proj / "cache" / "llm.journal").glob("*.jsonl")]
                for rec in store.read_jsonl(path)}
    assert 2 <= len(answered) < 6
    stub.reset()
    stub.set_chat(fake_extraction)
    again = subprocess.run([HRAG, *args], env=child_env(), capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    resent = [b for _, b in stub.requests if fingerprint(b["messages"]) in answered]
    assert resent == [] and stub.count(CHAT) == 6 - len(answered)
    ex = summary(again)["extract"]
    assert ex["pending"] == 0 and ex["failed"] == 0
    ids = [r["chunk_id"] for r in store.read_jsonl(proj / "cache" / "extractions.jsonl")]
    assert len(ids) == len(set(ids)) == 6
    # every answer is in cache/llm.jsonl now (the journals folded in and removed)
    assert {r["messages_hash"] for r in store.read_jsonl(proj / "cache" / "llm.jsonl")} >= answered
    assert not list((proj / "cache" / "llm.journal").glob("*.jsonl"))


@pytest.mark.ray
def test_an_address_with_no_cluster_is_one_line(tmp_path: Path) -> None:
    """No cluster there: a usage error naming the fix, nothing extracted (a fresh interpreter: this one is
    connected to the test cluster)."""
    from tests.stub_server import free_port

    proc = subprocess.run([HRAG, "index", str(SAMPLE / "people"), "-p", str(tmp_path / "p"), "--extractor", "rules",
                           "--ray", f"127.0.0.1:{free_port()}"], env={**child_env(), "RAY_ADDRESS": ""},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "cannot reach a Ray cluster" in line and "ray start --head" in line
    assert not list(store.read_jsonl(tmp_path / "p" / "cache" / "extractions.jsonl"))


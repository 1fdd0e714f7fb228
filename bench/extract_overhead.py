"""Extraction overhead per chunk, LLM time excluded, and the offline `hrag index sample_corpus` wall time.

1. Starts the stub OpenAI-compatible server in a child process, answering every chat request at once with a
   valid extraction built from the passage (a JSON object when the request asks for a schema, as the default
   format does for an OpenAI-compatible server), and runs the extract stage over the sample corpus (copied
   --copies times with a distinguishing line, so there are enough distinct chunks) in a fresh project, so
   nothing is cached. The CPU time of this process is then hrag's own work per chunk: building prompts, the
   client and its HTTP, parsing, checks, appending records (the server's work is in the other process).
   --format delimited measures the line format instead; --profile [tottime|cumulative] prints where the time goes.
2. Runs `hrag index sample_corpus` offline (rules extractor, built-in embedder, every stage) as a fresh
   process and prints its wall and CPU time.

    .venv/bin/python bench/extract_overhead.py [--copies 10] [--gleanings 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from harness import ROOT, hrag
from hrag_cli.core import offline

offline.setup()
os.environ.setdefault("OPENAI_API_KEY", "sk-bench-dummy")


def serve(port: int) -> None:
    from tests.stub_server import StubServer, fake_extraction

    stub = StubServer(port=port, record=False)
    stub.set_chat(lambda body: fake_extraction(body, limit=15))
    stub._httpd.serve_forever(poll_interval=0.05)


def copy_corpus(dst: Path, copies: int) -> None:
    src = ROOT / "sample_corpus"
    for k in range(copies):
        for p in src.rglob("*"):
            if p.is_file() and p.suffix in (".txt", ".md"):
                out = dst / f"copy{k}" / p.relative_to(src)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(f"Copy {k} of {p.name}.\n\n" + p.read_text(encoding="utf-8"), encoding="utf-8")


def bench_overhead(copies: int, gleanings: int, concurrency: int, fmt: str, hints: str | None,
                   profile: str | None) -> None:
    import multiprocessing

    from hrag_cli.core.config import load_settings
    from hrag_cli.extract.stage import run_extract
    from hrag_cli.chunk.stage import run_chunk
    from hrag_cli.core.progress import Reporter
    from hrag_cli.core.project import ProjectDir
    from tests.stub_server import free_port

    port = free_port()
    server = multiprocessing.get_context("fork").Process(target=serve, args=(port,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _bench_overhead(url, copies, gleanings, concurrency, fmt, hints, profile, load_settings, run_extract,
                        run_chunk, Reporter, ProjectDir)
    finally:
        server.terminate()
        server.join()


def _bench_overhead(url: str, copies: int, gleanings: int, concurrency: int, fmt: str, hints: str | None,
                    profile: str | None, load_settings, run_extract, run_chunk, Reporter, ProjectDir) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "docs"
        copy_corpus(docs, copies)
        proj = ProjectDir(Path(tmp) / "proj")
        proj.init()
        settings = load_settings(None, {"llm.model": "openai/stub-model", "llm.api_base": url,
                                        "extract.max_gleanings": gleanings, "llm.concurrency": concurrency,
                                        "extract.format": fmt, **({"extract.hints": hints} if hints else {})})
        quiet = Reporter("quiet")
        chunked = run_chunk(proj, settings, quiet, [docs])
        # warm up: import litellm and open its HTTP client once, and load the rules extractor's tables (the
        # candidate names), outside the timed run: once per process, not per chunk
        from hrag_cli.core.llm import LLMClient
        from hrag_cli.extract.rules import extract_rules

        extract_rules("", "Warm Up")

        warm = ProjectDir(Path(tmp) / "warm")
        warm.init()
        with LLMClient(warm, settings.llm) as client:
            client.chat([{"role": "user", "content": "Passage:\nWarm Up"}])
        prof = None
        if profile is not None:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        out = run_extract(proj, settings, quiet)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if prof is not None:
            import pstats

            prof.disable()
            pstats.Stats(prof).sort_stats(profile).print_stats(25)
    c = out.counts
    n_chunks, n_req = c["extracted_now"], c["llm_requests"]
    print(f"extract through an instant stub in another process ({fmt} format): {n_chunks} chunks "
          f"({chunked.counts['tokens']} tokens), {n_req} requests, concurrency {concurrency}, gleanings {gleanings}")
    print(f"  wall {wall:.2f}s, CPU of this process {cpu:.2f}s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"  hrag's own CPU per chunk    {cpu / max(n_chunks, 1) * 1000:.2f} ms")
    print(f"  hrag's own CPU per request  {cpu / max(n_req, 1) * 1000:.2f} ms")
    print(f"  wall per chunk              {wall / max(n_chunks, 1) * 1000:.2f} ms")


def bench_offline_index() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proj = Path(tmp) / "proj"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HRAG_")}
        run = hrag("index", ROOT / "sample_corpus", "-p", proj, "--extractor", "rules", "-q", env=env, check=False)
        if run.returncode != 0:
            print(f"offline index failed ({run.returncode}): {run.stderr.strip()}")
            return
        startup = hrag("--help", env=env)
        print(f"offline `hrag index sample_corpus` (all stages, rules extractor): {run.wall_s:.2f}s wall, "
              f"{run.cpu_s:.2f}s CPU (process start-up alone, `hrag --help`: {startup.wall_s:.2f}s)")
        shutil.rmtree(proj, ignore_errors=True)


def bench_rules_speed() -> None:
    from hrag_cli.chunk.chunking import chunk_text
    from hrag_cli.extract.rules import extract_rules

    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "sample_corpus").rglob("*.txt")))
    for size in (1200, 300):
        chunks = [c.text for c in chunk_text(text * 20, size, size // 10)]
        t0, c0 = time.perf_counter(), time.process_time()
        for i, c in enumerate(chunks):
            extract_rules(str(i), c)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"rules extractor: {len(chunks)} chunks of {size} tokens in {wall:.2f}s wall / {cpu:.2f}s CPU = "
              f"{len(chunks) / cpu:.0f} chunks/s of CPU")
    big = text * (1_000_000 // max(len(text), 1) + 1)
    t0 = time.perf_counter()
    n = len(chunk_text(big[:1_000_000], 1200, 100))
    print(f"chunking 1 MB of text: {n} chunks in {time.perf_counter() - t0:.2f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--gleanings", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--format", default="auto", choices=("auto", "json", "delimited"))
    ap.add_argument("--hints", choices=("rules", "none"), default=None, help="[extract] hints (default: hrag's)")
    ap.add_argument("--profile", nargs="?", const="tottime", choices=("tottime", "cumulative"), default=None,
                    help="print the 25 functions with the most own (or, with cumulative, total) time")
    ap.add_argument("--overhead-only", action="store_true", help="skip the rules and offline-index figures")
    args = ap.parse_args()
    bench_overhead(args.copies, args.gleanings, args.concurrency, args.format, args.hints, args.profile)
    if args.overhead_only:
        return
    bench_rules_speed()
    bench_offline_index()


if __name__ == "__main__":
    main()

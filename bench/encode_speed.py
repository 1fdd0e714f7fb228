"""Encode throughput of the built-in embedder (texts/second).

Usage: python bench/encode_speed.py [--n 20000] [--dim 2048 1024] [--corpus PATH]
       python bench/encode_speed.py --st FOLDER [--n 500] [--wait-policy ACTIVE] [--tokens 4096 8192]
                                    [--precision bf16 float32]   (hrag[local])

Texts are passage-length: the MuSiQue corpus passages (title + "\\n" + text, ~80 words) when the
shared bench file exists, otherwise deterministic synthetic passages of ~80 words. Reports, per dim:
IDF fit time, a cold run (fresh embedder: every word's features are built), and the best of three
warm runs (the word-feature cache is filled), as wall-clock and CPU-time texts/s. Encoding is
single-threaded, so on a busy machine the CPU-time figure is the one that measures the code.

With --st, the sentence-transformers back-end as hrag builds it (SentenceTransformerBackend) encodes n passages,
n fact-length texts and n short names, at each --precision and --tokens (tokens per forward pass), and prints the
cosine of each precision's vectors to the first one's (mean and worst); run it beside another busy process with
and without `--wait-policy ACTIVE` to see what the OMP_WAIT_POLICY=PASSIVE default buys (OpenMP reads the
variable once, so each setting is its own process).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from hrag_cli.embed.embedder import ST_TOKENS
from hrag_cli.embed.builtin import BuiltinEmbedder, IdfTable

from harness import data_dir, parse_args

CORPUS = "musique_train_corpus.json"   # in the benchmark data folder


def load_texts(corpus: Path | None, n: int) -> list[str]:
    """n passage-length texts, cycling through the corpus (so warm runs see repeated vocabulary)."""
    if corpus is not None and corpus.exists():
        rows = json.loads(corpus.read_text())
        base = [r["title"] + "\n" + r["text"] for r in rows]
    else:
        rng = random.Random(7)
        syll = ["ka", "lo", "mi", "ter", "ran", "so", "vel", "dor", "an", "is", "ex", "pu", "gra", "th"]
        vocab = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
        base = [" ".join(rng.choice(vocab) for _ in range(80)) + "." for _ in range(2000)]
    return [base[i % len(base)] for i in range(n)]


def timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def st_speed(folder: str, n: int, corpus: Path, wait_policy: str | None, tokens: list[int],
             precisions: list[str]) -> None:
    """Passages, facts and short names through the local model hrag would use, texts/s wall and CPU, per
    precision and token budget per forward pass; cosine of each precision's vectors to the first precision's."""
    import os

    import numpy as np

    if wait_policy:
        os.environ["OMP_WAIT_POLICY"] = wait_policy
    from hrag_cli.embed.embedder import SentenceTransformerBackend

    passages = load_texts(corpus, n)
    words = [w.strip(".,;:()") for t in passages for w in t.split()]
    names = sorted({w for w in words if w[:1].isupper()})[:n]
    facts = [f"({words[i]}, {words[i + 1]} {words[i + 2]}, {words[i + 3]} {words[i + 4]})"   # fact-length texts
             for i in range(0, min(len(words) - 5, 5 * n), 5)][:n]
    first: dict[str, np.ndarray] = {}
    for precision in precisions:
        backend = SentenceTransformerBackend(folder, precision)
        backend.encode_raw(passages[:8])   # load the model outside the timing
        print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}  model_id {backend.model_id}")
        for budget in tokens:
            backend.tokens_per_pass = budget
            for label, texts in (("passages", passages), ("facts", facts), ("names", names)):
                box: dict[str, np.ndarray] = {}
                wall, cpu = timed(lambda: box.setdefault("v", backend.encode_raw(texts)))
                v = box["v"] / np.linalg.norm(box["v"], axis=1, keepdims=True)
                cos = (v * first.setdefault(label, v)).sum(axis=1)
                print(f"{precision:8s} tokens {budget:6d} {label:9s} {len(texts):6d} texts  {len(texts) / wall:7,.0f} "
                      f"texts/s (wall)  {len(texts) / cpu:7,.0f} texts/s (cpu)  cosine to {precisions[0]}: "
                      f"mean {cos.mean():.6f} worst {cos.min():.6f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=None, help="texts per run (20000; 500 with --st)")
    ap.add_argument("--dim", type=int, nargs="+", default=[2048, 1024])
    ap.add_argument("--corpus", type=Path, default=None, help=f"passages (default: {CORPUS} in the data folder)")
    ap.add_argument("--st", metavar="FOLDER", help="time a sentence-transformers model folder instead")
    ap.add_argument("--wait-policy", choices=["ACTIVE", "PASSIVE"], help="with --st: OMP_WAIT_POLICY to force")
    ap.add_argument("--tokens", type=int, nargs="+", default=[ST_TOKENS],
                    help=f"with --st: tokens per forward pass to compare (default hrag's, {ST_TOKENS})")
    ap.add_argument("--precision", nargs="+", default=["bf16"], choices=["bf16", "float32"],
                    help="with --st: embed.precision values to compare (the first is the cosine reference)")
    args = parse_args(ap)
    args.corpus = args.corpus or data_dir() / CORPUS
    if args.st:
        st_speed(args.st, args.n or 500, args.corpus, args.wait_policy, args.tokens, args.precision)
        return

    texts = load_texts(args.corpus, args.n or 20000)
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(f"{len(texts)} texts, {words:.0f} words/text on average")
    wall, cpu = timed(lambda: IdfTable.fit(texts))
    table = IdfTable.fit(texts)
    print(
        f"IdfTable.fit: {len(texts) / wall:,.0f} texts/s (wall)  {len(texts) / cpu:,.0f} texts/s (cpu)"
        f"   fingerprint {table.fingerprint()}"
    )
    for dim in args.dim:
        emb = BuiltinEmbedder(table, dim=dim)
        cw, cc = timed(lambda: emb.encode(texts))
        best_w = best_c = float("inf")
        for _ in range(3):
            w, c = timed(lambda: emb.encode(texts))
            best_w, best_c = min(best_w, w), min(best_c, c)
        print(
            f"dim={dim:5d} {emb.model_id:32s} cold {len(texts) / cw:8,.0f} texts/s"
            f" | warm {len(texts) / best_w:8,.0f} texts/s (wall)  {len(texts) / best_c:8,.0f} texts/s (cpu)"
            f" | {dim * 4 / 1024:.0f} KiB/vector"
        )


if __name__ == "__main__":
    main()

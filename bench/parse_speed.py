"""Extraction parser speed: the worst time per 100 KB over adversarial and random model outputs.

Every adversarial shape (tests/parser_inputs.py: a row prefix, one fragment repeated, a suffix) is parsed at
100 KB, the `--top` slowest of them again at 1 MB, plus `--random` random outputs of 100 KB..1 MB; each time
(best of 2) is divided by the output's size in 100 KB. A linear parser gives about the same figure at both
sizes. Figures are wall times on whatever machine runs this; compare paired runs.

    .venv/bin/python bench/parse_speed.py [--random 40] [--top 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import time

import harness  # noqa: F401  (makes the suite's helpers under tests/ importable)
from hrag_cli.extract.parser import parse_extraction
from tests.parser_inputs import adversarial_outputs, random_output

UNIT = 100_000


def per_unit(text: str) -> float:
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        parse_extraction(text)
        best = min(best, time.perf_counter() - t0)
    return best / (len(text) / UNIT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=40, help="random outputs to parse")
    ap.add_argument("--top", type=int, default=40, help="slowest 100 KB shapes to time again at 1 MB")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    times = {lab: per_unit(text) for lab, text in adversarial_outputs(UNIT)}
    ranked = sorted(times, key=times.get, reverse=True)
    print(f"adversarial  100 KB: {len(times)} shapes, mean {sum(times.values()) / len(times) * 1000:.2f} ms/100KB, "
          f"worst {times[ranked[0]] * 1000:.2f} ms/100KB ({ranked[0]})")
    top = set(ranked[: args.top])
    big = {lab: per_unit(text) for lab, text in adversarial_outputs(10 * UNIT) if lab in top}
    worst = max(big, key=big.get)
    print(f"adversarial 1000 KB: the {len(big)} slowest shapes, worst {big[worst] * 1000:.2f} ms/100KB ({worst}); "
          f"same shapes at 100 KB: worst {max(times[k] for k in big) * 1000:.2f} ms/100KB")
    rng = random.Random(args.seed)
    worst, worst_size, total = 0.0, 0, 0.0
    for _ in range(args.random):
        size = rng.randrange(UNIT, 10 * UNIT + 1)
        s = per_unit(random_output(rng, size))
        total += s
        if s > worst:
            worst, worst_size = s, size
    print(f"random 100 KB..1 MB: {args.random} outputs, mean {total / args.random * 1000:.2f} ms/100KB, "
          f"worst {worst * 1000:.2f} ms/100KB (at {worst_size // 1000} KB)")


if __name__ == "__main__":
    main()

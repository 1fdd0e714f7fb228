"""Extraction parser speed: the worst time per 100 KB over adversarial and random model outputs.

Every adversarial shape (tests/parser_inputs.py: a row prefix, one fragment repeated, a suffix) is parsed at
100 KB and at 1 MB, plus `--random` random outputs of 100 KB..1 MB; each time is divided by the output's
size in 100 KB. A linear parser gives about the same figure at both sizes. Figures are wall times on
whatever machine runs this; compare paired runs.

    .venv/bin/python bench/parse_speed.py [--random 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hrag_cli.extract.parser import parse_extraction  # noqa: E402
from tests.parser_inputs import adversarial_outputs, random_output  # noqa: E402

UNIT = 100_000


def per_unit(text: str) -> float:
    t0 = time.perf_counter()
    parse_extraction(text)
    return (time.perf_counter() - t0) / (len(text) / UNIT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=40, help="random outputs to parse")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    for size in (UNIT, 10 * UNIT):
        worst, label, total, n = 0.0, "", 0.0, 0
        for lab, text in adversarial_outputs(size):
            s = per_unit(text)
            total += s
            n += 1
            if s > worst:
                worst, label = s, lab
        print(f"adversarial {size // 1000:>5} KB: {n} shapes, mean {total / n * 1000:.2f} ms/100KB, "
              f"worst {worst * 1000:.2f} ms/100KB ({label})")
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

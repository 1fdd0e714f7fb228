"""Peak memory (max RSS) of `hrag index --stop-after chunk` on one huge text file and on many tiny files.
Figures, not pass/fail: `python bench/input_memory.py --big-mb 200 --tiny 50000`."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness import hrag

PARA = ("The harbour commission of Oldport met on a grey morning to weigh the cost of the new sea wall, and "
        "Mara Quint, who had built the Selby Lighthouse, argued for stone over timber. ") * 3 + "\n\n"


def run(docs: Path, proj: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one index run."""
    r = hrag("index", docs, "-p", proj, "--stop-after", "chunk", "--extractor", "rules", "-q")
    return r.wall_s, r.peak_rss_mb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-mb", type=int, default=200)
    ap.add_argument("--tiny", type=int, default=50000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hrag-mem-"))
    if args.tiny:
        tiny = work / "tiny"
        tiny.mkdir()
        for i in range(args.tiny):
            (tiny / f"{i:06d}.txt").write_text(f"Document {i}: Mara Quint visited Oldport in {1900 + i % 100}.")
        secs, mb = run(tiny, work / "p_tiny")
        print(f"{args.tiny} tiny files: {secs:.1f} s, peak RSS {mb:.0f} MB")
    if args.big_mb:
        big = work / "big"
        big.mkdir()
        with open(big / "big.txt", "w") as fh:
            for _ in range(args.big_mb * (1 << 20) // len(PARA)):
                fh.write(PARA)
        secs, mb = run(big, work / "p_big")
        print(f"one {args.big_mb} MB file: {secs:.1f} s, peak RSS {mb:.0f} MB")


if __name__ == "__main__":
    main()

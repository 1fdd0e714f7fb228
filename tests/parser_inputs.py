"""Random and adversarial LLM extraction outputs for the parser's speed checks (tests/test_parser.py asserts
linear growth with them; bench/parse_speed.py prints the worst time per 100 KB).

A model stuck in a loop writes long runs of one thing: blanks, tabs, a delimiter or a fragment of one, the
same row again. `random_output` mixes well-formed rows with such runs; `adversarial_outputs` puts one long
run after each kind of row prefix, the shapes that made the old parser quadratic.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

D = "<|#|>"

ROWS = [
    f"entity{D}Acme Corp{D}organization{D}A company that makes anvils.\n",
    f"relation{D}Acme Corp{D}Road Runner{D}sells to{D}trade, retail{D}Acme sells anvils to him.{D}7\n",
    '("entity"<|>"ALEX"<|>"PERSON"<|>"Alex is a scientist.")##\n',
    '("relationship"<|>"ALEX"<|>"TAYLOR"<|>"Alex reports to Taylor."<|>"hierarchy"<|>7)##\n',
    f"entity{D}(*){D}artifact{D}An album.\n",
    "<|COMPLETE|>\n",
]
FRAGMENTS = [" ", "\t", "<", "|", "#", ">", "<|", "|>", "#|", "|#", "##", "<|#|", "<|#|>", "<|>", "<[#|>", "<|*|>",
             "\"", "'", "(", ")", "*", "entity", "relation", " entity", "7", "8/", "\ue000", "\n"]
PREFIXES = ["", "entity<|#|>", "entity<|#|>A<|#|>t<|#|>d ", "relation<|#|>A<|#|>B<|#|>", "relation<|#|>A<|#|>B<|#|>p<|#|>k<|#|>d<|#|>5",
            '("entity"<|>"A"<|>"t"<|>"d")', "<", "entity<|#|>A<|#|>t<|#|>d ##", "content_keywords<|#|>"]
SUFFIXES = ["", "x", "<|#|>", "|", ">", "\n<|COMPLETE|>", "entity<|#|>B<|#|>t<|#|>d", "/10"]


def random_output(rng: random.Random, size: int, scale: int = 1) -> str:
    """About `size` characters: rows, loose fragments, and long runs (up to a quarter of `size`) of one
    fragment, as a looping model writes them. `scale` repeats every piece and lengthens every run that many
    times: the same seed gives the same output `scale` times longer, for comparing sizes."""
    out: list[str] = []
    n = 0
    while n < size:
        r = rng.random()
        if r < 0.45:
            piece = rng.choice(ROWS)
        elif r < 0.85:
            piece = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 12)))
        else:
            frag = rng.choice(FRAGMENTS[:20])
            piece = frag * max(1, rng.randrange(size // 4 + 1) // len(frag))
        out.append(piece * scale)
        n += len(piece)
    return "".join(out)


def adversarial_outputs(size: int) -> Iterator[tuple[str, str]]:
    """(label, text) of about `size` characters: each prefix, then one fragment repeated, then each suffix."""
    for pre in PREFIXES:
        for frag in FRAGMENTS:
            run = frag * max(1, (size - len(pre)) // len(frag))
            for suf in SUFFIXES:
                yield f"{pre!r}+{frag!r}*n+{suf!r}", pre + run + suf

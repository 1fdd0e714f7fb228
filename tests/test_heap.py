"""heap.keep_freed_memory: a freed big block serves the next allocation without new page faults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_LOOP = """
import resource, sys
import numpy as np
from hrag_cli.core.heap import keep_freed_memory
kept = keep_freed_memory()
x = np.ones(50_000_000 // 8); del x      # the first one faults in either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    x = np.ones(50_000_000 // 8); del x
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _run(env: dict[str, str]) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _LOOP], env=env, capture_output=True, text=True, check=True)
    kept, faults = out.stdout.split()
    return kept == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_and_a_users_malloc_settings_win() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    kept, faults = _run(env)
    assert kept and faults < 1000                  # 10 x 50 MB with unmapping: ~12k faults (or 10 x 24 huge pages)
    kept, faults = _run({**env, "MALLOC_ARENA_MAX": "2"})
    assert not kept and faults > 200


_TRIM = """
from hrag_cli.core.heap import give_back, keep_freed_memory
def rss():
    return int(open("/proc/self/statm").read().split()[1])
assert keep_freed_memory()
blocks = [bytearray(1 << 20) for _ in range(200)]
keep = bytearray(16)                       # above them on the heap: their space cannot be trimmed off the top
del blocks
held = rss()
give_back()
print(held - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_give_back_returns_the_kept_pages() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _TRIM], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) > 150 * 256          # pages: most of the 200 MiB freed but kept

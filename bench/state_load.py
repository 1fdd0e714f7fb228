"""CPU of opening resolve's saved state (graph/resolve_state.bin: its header and block index, all a run after
new documents reads before looking up its keys) and of reading every key of it in order (the key frames of
every block; a +1 % reads only its keys' blocks).

    .venv/bin/python bench/state_load.py PROJECT
    PYTHONPATH=OLD_CHECKOUT .venv/bin/python bench/state_load.py PROJECT    # the same on older code
"""

from __future__ import annotations

import argparse
import gc
import inspect
import time
from pathlib import Path

from harness import peak_rss_mb
from hrag_cli.resolve import stage as resolve
from hrag_cli.resolve import state as resolve_state
from hrag_cli.core.project import ProjectDir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("project", type=Path)
    path = ProjectDir(ap.parse_args().project).resolve_state_path
    gc.disable()                # as resolve runs it (resolve.gc_paused)
    extra = ()
    if "accs" in inspect.signature(resolve_state.load).parameters:     # code before the state kept tuples
        extra = ({"entities": resolve._EntityAcc, "relations": resolve._RelationAcc, "facts": resolve._FactAcc},)
    t0 = time.process_time()
    merged, _ = resolve_state.load(path, resolve.Merged, *extra)
    t1 = time.process_time()
    if isinstance(merged.entities, getattr(resolve_state, "Lazy", ())):    # a keyed state: its key frames
        for s in resolve_state.SECTIONS:
            merged.entities.reader.keys(s)
    else:
        resolve_state.sorted_keys(merged)
    t2 = time.process_time()
    rss = peak_rss_mb() / 1024
    # a keyed state (version 2 on) opens without reading its accumulators: its counts are in its header
    n = merged.totals() if hasattr(merged, "totals") else {
        s: len(getattr(merged, s)) for s in ("entities", "relations", "facts", "mentions")}
    print(f"{path}: {path.stat().st_size / 1e6:.0f} MB, load {t1 - t0:.2f} s CPU, sorted keys {t2 - t1:.2f} s CPU, "
          f"peak RSS {rss:.2f} GB ({n['entities']} entities, {n['relations']} relations, "
          f"{n['facts']} facts, {n['mentions']} mentions)")


if __name__ == "__main__":
    main()

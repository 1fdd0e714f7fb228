"""bench/: every script documented in bench/README.md, and the harness the only place that runs `hrag`,
meters RSS or touches sys.path."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _scripts() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if p.name != "harness.py")


def test_every_script_is_in_the_bench_readme() -> None:
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    assert _scripts()
    assert [p.name for p in _scripts() if f"`{p.name}`" not in readme] == []


def test_only_the_harness_runs_hrag_and_meters_memory() -> None:
    for path in _scripts():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"sys\.path\.(insert|append)", text), path.name
        assert "ru_maxrss" not in text, path.name
        assert not re.search(r"""["']hrag_cli\.cli["']|bin["'] */ *["']hrag["']|with_name\(["']hrag""", text), path.name

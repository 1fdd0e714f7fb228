"""Resolve's merge from scratch in partitions spilled to disk (resolve/partition.py) writes what the merge in
memory writes, byte for byte (record files, merges.jsonl, the state file, graph.pkl, walk.npz); additions merge
into the state it saved; a run killed mid-merge is finished by the next one. A small PART_EVENTS makes the sample
corpus take several partitions."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.core.project import ProjectDir
from hrag_cli.resolve import partition
from hrag_cli.resolve import state as resolve_state
from tests.stub_server import CHAT, default_chat
from tests.test_resolve_incremental import SAMPLE, _add, _index, _merged

FILES = ("entities_path", "relations_path", "facts_path", "merges_path", "graph_path", "walk_path",
         "resolve_state_path")
SMALL = 40      # mention events per partition: the sample corpus takes a few dozen partitions


def _bytes(project: Path) -> dict[str, object]:
    """Each file's bytes (a record file's logical lines: its base with its patch applied); the state file's header and every key with its accumulator (marshal's bytes depend on
    which strings the process happened to share)."""
    p = ProjectDir(project)
    out: dict[str, object] = {name: b"".join(store.line_blocks(getattr(p, name))) for name in FILES[:3]}
    out.update({name: getattr(p, name).read_bytes() for name in FILES[3:-1]})
    if not p.resolve_state_path.exists():      # a project whose descriptions an LLM may summarise keeps none
        return out
    reader = resolve_state.Reader(p.resolve_state_path)
    out["resolve_state_path"] = (reader._raw, {s: ([reader.find(s, k) for k in reader.keys(s)],
                                                   reader.index[s][0], reader.index[s][2]) for s in resolve_state.SECTIONS})
    return out


def _built(docs: Path, project: Path, monkeypatch: pytest.MonkeyPatch, events: int | None, *extra: str) -> str:
    if events is not None:
        monkeypatch.setattr(partition, "PART_EVENTS", events)
    try:
        return _index(docs, project, *extra)
    finally:
        monkeypatch.undo()


def _resolve(project: Path, monkeypatch: pytest.MonkeyPatch, events: int | None, *extra: str) -> str:
    from typer.testing import CliRunner

    from hrag_cli.cli import app

    if events is not None:
        monkeypatch.setattr(partition, "PART_EVENTS", events)
    try:
        result = CliRunner().invoke(app, ["resolve", "-p", str(project), *extra], catch_exceptions=False)
    finally:
        monkeypatch.undo()
    assert result.exit_code == 0, result.output
    return result.output


def test_partitions_write_the_bytes_of_the_merge_in_memory_and_additions_merge_into_their_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    out = _built(docs, tmp_path / "parts", monkeypatch, SMALL)
    assert "partitions" in out
    assert not partition.spill_folder(ProjectDir(tmp_path / "parts")).exists()
    _built(docs, tmp_path / "memory", monkeypatch, None)
    got, want = _bytes(tmp_path / "parts"), _bytes(tmp_path / "memory")
    assert [n for n in FILES if got.get(n) != want.get(n)] == []
    counts = ProjectDir(tmp_path / "parts").stage("resolve").counts
    assert counts == ProjectDir(tmp_path / "memory").stage("resolve").counts and counts["facts"] > 0
    # additions: merged into the state the partitions saved, the same files as a fresh build of everything
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive. "
                            "Quillon Vesk founded the Amberline Guild in Port Ellery.\n")
    _built(docs, tmp_path / "parts", monkeypatch, SMALL)
    assert _merged(tmp_path / "parts") == 1
    _built(docs, tmp_path / "fresh", monkeypatch, SMALL)
    got, want = _bytes(tmp_path / "parts"), _bytes(tmp_path / "fresh")
    assert [n for n in FILES if n != "resolve_state_path" and got[n] != want[n]] == []


def test_llm_aliases_and_summaries_in_partitions_equal_the_merge_in_memory(
        stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge planned by aliases (ids decided over every record) and summaries run per partition."""
    from tests.test_aliases import DOCS, scripted

    stub.set_chat(scripted)
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.txt", "b.txt"):
        (docs / name).write_text(DOCS[name])
    llm = ("--llm-model", "openai/stub-model", "--llm-api-base", stub.url)
    summaries = ("--summary-min-fragments", "1", *llm)
    for name, events in (("parts", 4), ("memory", None)):
        _built(docs, tmp_path / name, monkeypatch, events, *llm)
        out = _resolve(tmp_path / name, monkeypatch, events, *summaries)
        assert ("partitions" in out) == (events is not None)
        assert ProjectDir(tmp_path / name).stage("resolve").counts["summaries"] > 0
    got, want = _bytes(tmp_path / "parts"), _bytes(tmp_path / "memory")
    assert ProjectDir(tmp_path / "parts").merges_path.read_bytes()      # the alias joined two names
    assert [n for n in FILES if got.get(n) != want.get(n)] == []


_CHILD = """import sys
from hrag_cli.resolve import partition
partition.PART_EVENTS = int(sys.argv[1])
from hrag_cli.cli import app
app(sys.argv[2:])
"""


def test_kill_9_mid_partitioned_merge_then_the_next_run_finishes_it(stub, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed while the partitions' spill files are on disk (summaries slowed down: the kill lands mid-merge),
    the next run removes them and ends with the files of a run that was never killed."""
    def slow(body: dict):
        time.sleep(0.3)
        return default_chat(body)

    stub.set_chat(slow)
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    root = tmp_path / "p"
    _built(docs, root, monkeypatch, SMALL)
    llm = ["--llm-model", "openai/stub", "--llm-api-base", stub.url, "--summary-min-fragments", "1"]
    def spills() -> list[Path]:      # in the generation the run writes (core/project.py)
        return list(root.glob(f"gens/*/graph/{partition.spill_folder(ProjectDir(root)).name}"))

    env = {**os.environ, "OPENAI_API_KEY": "sk-test-dummy"}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(SMALL), "resolve", "-p", str(root), "-q", *llm],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (spills() and stub.count(CHAT) >= 2):
            time.sleep(0.02)
        assert proc.poll() is None and spills(), "the merge finished before it was killed; slow the stub more"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    stub.set_chat(default_chat)
    _resolve(root, monkeypatch, SMALL, *llm)
    assert not spills()     # the killed run's generation (its spill files in it) is gone
    _built(docs, tmp_path / "fresh", monkeypatch, None)
    _resolve(tmp_path / "fresh", monkeypatch, None, *llm)
    got, want = _bytes(root), _bytes(tmp_path / "fresh")
    assert [n for n in FILES if got.get(n) != want.get(n)] == []

"""Project directory, settings layering, manifest states and the writer lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrag_cli.core.config import Settings, default_toml, load_settings
from hrag_cli.core.errors import HragError, ProjectLocked, UsageError
from hrag_cli.core.project import ProjectDir, fingerprint, resolve_root


def test_init_creates_layout_and_commented_toml(tmp_path: Path) -> None:
    proj = ProjectDir(tmp_path / "p")
    proj.init()
    for d in ("cache", "cache/embeddings", "graph", "vectors"):
        assert (proj.root / d).is_dir()
    text = proj.toml_path.read_text()
    assert "[chunk]" in text and "# tokens = 1200" in text
    # defaults load unchanged from the commented file
    assert proj.settings() == Settings()


def test_settings_layering(tmp_path: Path) -> None:
    toml = tmp_path / "hrag.toml"
    toml.write_text('[chunk]\ntokens = 500\n[llm]\nmodel = "from-toml"\n')
    s = load_settings(toml, environ={})
    assert s.chunk.tokens == 500 and s.llm.model == "from-toml"
    s = load_settings(toml, environ={"HRAG_LLM_MODEL": "from-env"})
    assert s.llm.model == "from-env"
    s = load_settings(toml, {"llm.model": "from-flag", "chunk.tokens": None}, environ={"HRAG_LLM_MODEL": "e"})
    assert s.llm.model == "from-flag" and s.chunk.tokens == 500


def test_bad_settings_are_usage_errors(tmp_path: Path) -> None:
    toml = tmp_path / "hrag.toml"
    toml.write_text("[chunk]\ntokenz = 5\n")
    with pytest.raises(UsageError, match="unknown setting 'chunk.tokenz'"):
        load_settings(toml, environ={})
    toml.write_text('[chunk]\ntokens = "many"\n')
    with pytest.raises(UsageError, match="chunk.tokens"):
        load_settings(toml, environ={})
    toml.write_text("[chunk\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_settings(toml, environ={})
    s = load_settings(None, {"extract.entity_types": "person, place"}, environ={})
    assert s.extract.entity_types == ["person", "place"]


def test_default_toml_parses() -> None:
    import tomllib

    tomllib.loads(default_toml())


def test_manifest_states(tmp_path: Path) -> None:
    proj = ProjectDir(tmp_path)
    proj.init()
    assert proj.stage_state("resolve", "fp1") == "missing"
    proj.record_stage("resolve", "fp1", "digest", {"entities": 3})
    assert proj.stage_state("resolve", "fp1") == "fresh"
    assert proj.stage_state("resolve", "fp2") == "stale"
    assert proj.stage("resolve").counts == {"entities": 3}
    proj.forget_stage("resolve")
    assert proj.stage("resolve") is None


def test_damaged_manifest_is_a_clear_error(tmp_path: Path) -> None:
    proj = ProjectDir(tmp_path)
    proj.init()
    proj.manifest_path.write_text("[1, 2]")
    with pytest.raises(HragError, match="damaged") as err:   # exit 1: a damaged project, not a usage mistake
        proj.manifest()
    assert not isinstance(err.value, UsageError) and err.value.exit_code == 1
    proj.manifest_path.write_text('{"stages": {"chunk"')      # not JSON at all (hand edit, disk trouble)
    with pytest.raises(HragError, match="damaged") as err:
        proj.manifest()
    assert not isinstance(err.value, UsageError) and err.value.exit_code == 1


def test_fingerprint_is_order_independent_for_dicts() -> None:
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_resolve_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HRAG_PROJECT", raising=False)
    assert resolve_root(None) == Path(".hrag")
    monkeypatch.setenv("HRAG_PROJECT", "/x/y")
    assert resolve_root(None) == Path("/x/y")
    assert resolve_root("/z") == Path("/z")


def test_second_writer_fails_fast_even_across_processes(tmp_path: Path) -> None:
    proj = ProjectDir(tmp_path)
    with proj.lock():
        with pytest.raises(ProjectLocked, match="locked by pid"):
            with ProjectDir(tmp_path).lock():
                pass
        code = (
            "import sys; from hrag_cli.core.project import ProjectDir\n"
            "from hrag_cli.core.errors import ProjectLocked\n"
            f"try:\n    ProjectDir({str(tmp_path)!r}).lock().__enter__()\nexcept ProjectLocked:\n    sys.exit(7)\n"
        )
        assert subprocess.run([sys.executable, "-c", code]).returncode == 7
    with proj.lock():  # released
        pass


def test_a_forgotten_record_still_vouches_for_unchanged_files(tmp_path: Path) -> None:
    """resolve forgets the synonyms record; the next synonyms record keeps the whole-file hashes of the files it
    left alone instead of hashing them again, so a file damaged in between (same size and mtime, a byte the
    sampled hash does not read) is still caught by the full check, as it would be under a stale record."""
    proj = ProjectDir(tmp_path)
    proj.init()
    path = proj.gen_dir / "graph" / "synonyms.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(range(256)) * 4096)           # 1 MiB: the quick hash samples it
    proj.record_stage("synonyms", "fp", "digest")
    recorded = proj.manifest()["stages"]["synonyms"]["artifacts"]["graph/synonyms.jsonl"]
    proj.forget_stage("synonyms")
    assert proj.stage("synonyms") is None and proj.stage_state("synonyms", "fp") == "missing"
    st = path.stat()
    with open(path, "r+b") as fh:                        # a byte between the sampled blocks
        fh.seek(300_000)
        fh.write(b"\xff")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not proj.check(full=False)
    proj.record_stage("synonyms", "fp", "digest")
    data = proj.manifest()
    assert data["stages"]["synonyms"]["artifacts"]["graph/synonyms.jsonl"] == recorded
    assert "forgotten" not in data                        # used once, then gone
    assert [p.reason for p in proj.check(full=True)] == ["damaged (its full hash differs)"]

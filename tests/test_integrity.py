"""A project that knows when its files are wrong, and readers that see one consistent version.

The sample corpus is indexed once per module; every damage case works on a copy. Commands run through the real
CLI entry point in-process (tests/damage.py), the kill tests as real subprocesses.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.damage import DAMAGES, QUERIES, answers, build, cli, project_files, run_case
from tests.stub_server import CHAT, EMBED, default_chat, default_embed

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "sample_corpus"
HRAG = str(Path(sys.executable).with_name("hrag"))
FAST = QUERIES[:2]   # ppr and mix between them open every artifact a query reads


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("integrity") / "built"
    return root, build(root, CORPUS, FAST)


def _copy(built: Path, dst: Path) -> Path:
    shutil.copytree(built, dst, symlinks=True)
    return dst


# -- the damage matrix ---------------------------------------------------------------------------------------
# The checks first, then one file of each other kind with one damage each (rotating through the four
# kinds), to stay fast; bench/damage_matrix.py runs and prints the full product (every file x every damage).
USER_CHECKS = [("graph/entities.jsonl", "truncate"), ("graph/facts.jsonl", "truncate"),
               ("vectors/chunks.csc-data.npy", "truncate"), ("graph/graph.pkl", "delete"),
               ("graph/entities.jsonl", "empty"), ("vectors/facts.ids.jsonl", "delete"),
               ("vectors/chunks.csc-data.npy", "zero"), ("vectors/chunks.csc-data.npy", "empty"), ("vectors/bm25", "truncate"),
               ("manifest.json", "truncate"), ("manifest.json", "delete"), ("project.json", "empty")]
OTHERS = ["docs.jsonl", "chunks.jsonl", "graph/synonyms.jsonl", "vectors/entities.csr-cols.npy", "vectors/idf.npz",
          "cache/extractions.jsonl"]


def test_damage_matrix(built, tmp_path: Path) -> None:
    root, baseline = built
    files = project_files(root)
    assert "graph/entities.jsonl" in files and "vectors/chunks.csc-data.npy" in files
    others = [next(f for f in files if Path(f).match(pat)) for pat in OTHERS]
    cases = list(USER_CHECKS) + [(f, DAMAGES[i % 4]) for i, f in enumerate(others)]
    failures = []
    for rel, how in cases:
        r = run_case(root, tmp_path, rel, how, baseline, FAST)
        # never a different answer with exit 0; a refusal is exit 1 and one line naming the file and the fix
        if r["query"] == "WRONG" or r["query"].startswith("crash") or r["query"] not in ("same", "refuse1"):
            failures.append((rel, how, r))
        elif r["query"] == "refuse1" and ("hrag index" not in r["query_err"] or Path(rel).name not in r["query_err"]):
            failures.append((rel, how, r))
        # a plain `hrag index -p P` restores the undamaged answers
        if r["index"] != "restored":
            failures.append((rel, how, r))
        # status names what an artifact check can see: every file a stage wrote
        # (a damaged manifest is itself the one-line error status gives, exit 1, naming the file and the fix)
        if r["query"] == "refuse1" and r["status"] != ("error" if rel == "manifest.json" else "flags"):
            failures.append((rel, how, r))
    assert not failures, failures


def test_status_names_the_damaged_file_and_verify_hashes_whole_files(built, tmp_path: Path) -> None:
    root = _copy(built[0], tmp_path / "p")
    code, out, _ = cli("status", "-p", str(root), "--json")
    assert code == 0 and "damaged" not in orjson.loads(out)
    # a byte flipped in the middle of a big file escapes the sampled check but not --verify
    target = root / "vectors" / "chunks.csc-data.npy"
    data = bytearray(target.read_bytes())
    if len(data) > 300_000:
        data[len(data) // 2 + 12345] ^= 0xFF
    else:
        data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    code, out, _ = cli("status", "-p", str(root), "--json", "--verify")
    info = orjson.loads(out)
    assert code == 0 and info["stages"]["synonyms"]["state"] == "damaged"
    assert any("vectors/chunks.csc-data.npy" in line and "hrag index" in line for line in info["damaged"])


def test_manifest_stage_that_is_not_an_object_is_one_clean_line(built, tmp_path: Path) -> None:
    root = _copy(built[0], tmp_path / "p")
    data = orjson.loads((root / "manifest.json").read_bytes())
    data["stages"]["resolve"] = "oops"
    (root / "manifest.json").write_bytes(orjson.dumps(data))
    for args in (("status",), ("query", "flood")):
        code, _, err = cli(*args, "-p", str(root))
        assert code == 1 and len(err.strip().splitlines()) == 1 and "manifest.json is damaged" in err, err
    code, _, err = cli("index", str(CORPUS), "-p", str(root), "-q")   # the fix the message gives
    assert code == 0, err
    code, got, err = answers(root, FAST)
    assert code == 0 and got == built[1], err


def test_a_damaged_manifest_keeps_what_the_project_was_built_with(built, tmp_path: Path) -> None:
    from hrag_cli.core.project import ProjectDir

    root = _copy(built[0], tmp_path / "p")
    before = ProjectDir(root).remembered()
    assert before and orjson.loads((root / "project.json").read_bytes())["built_with"] == before
    (root / "manifest.json").resolve().write_bytes(b"")
    assert ProjectDir(root).remembered() == before         # a plain `hrag index` rebuilds with the same settings


def test_damaged_embedding_cache_header_does_not_break_queries(built, tmp_path: Path) -> None:
    root, baseline = built
    root = _copy(root, tmp_path / "p")
    for meta in (root / "cache" / "embeddings").glob("*.json"):
        meta.write_bytes(b"{not json")
    code, got, err = answers(root, FAST)
    assert code == 0 and got == baseline, err


# -- commits and consistent readers --------------------------------------------------------------------------
def test_a_reader_keeps_its_generation_while_a_rebuild_commits(built, tmp_path: Path) -> None:
    """A query opened before a rebuild reads one complete generation (never half of the new one), and a
    rebuild never tells it "not built yet"; the generation it pinned outlives two commits."""
    from hrag_cli.core.project import ProjectDir
    from hrag_cli.query.index import QueryIndex

    from hrag_cli.export.run import load_export_graph

    root = _copy(built[0], tmp_path / "p")
    reader = ProjectDir(root)
    before = reader.entities_path.read_bytes()
    ix = QueryIndex(reader, reader.settings())
    ix.require_built()
    exported = load_export_graph(reader).counts()
    for threshold in ("0.6", "0.9"):   # two commits, each rewriting synonyms.jsonl and graph.pkl
        code, _, err = cli("synonyms", "-p", str(root), "--threshold", threshold, "-q")
        assert code == 0, err
    assert ProjectDir(root).gen_dir != reader.gen_dir
    assert len(_gens(root)) == 2                    # the pinned one and the current one, nothing in between
    ix.require_built()                              # still intact and still built: its files are untouched
    assert reader.entities_path.read_bytes() == before
    assert ix.walk.vcount() > 0 and ix.chunks
    assert load_export_graph(reader).counts() == exported      # export too: the same version, whole
    del reader, ix
    code, _, err = cli("synonyms", "-p", str(root), "--threshold", "0.6", "-q")
    assert code == 0 and len(_gens(root)) == 1, err   # unpinned, it goes at the next commit


def _gens(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "gens").iterdir())


def test_a_rebuild_with_no_readers_leaves_one_generation(built, tmp_path: Path) -> None:
    """Every rewritten file exists once on disk: the old version goes at the switch when nobody reads it."""
    root = _copy(built[0], tmp_path / "p")
    for threshold in ("0.6", "0.9"):
        code, _, err = cli("synonyms", "-p", str(root), "--threshold", threshold, "-q")
        assert code == 0, err
        assert _gens(root) == [os.readlink(root / "current").split("/")[-1]]


def test_a_reader_whose_generation_is_switched_before_it_pins_retries(built, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The race between a reader's readlink and its flock: a writer switches and deletes the generation just
    read; the reader notices `current` moved and opens the new one, whole."""
    from hrag_cli.core import project as project_mod

    root = _copy(built[0], tmp_path / "p")
    old = _gens(root)
    real_pin = project_mod.ProjectDir._pin
    raced = []

    def pin_late(self, gen: Path) -> None:
        if not raced:
            raced.append(gen)
            monkeypatch.setattr(project_mod.ProjectDir, "_pin", real_pin)
            code, _, err = cli("synonyms", "-p", str(root), "--threshold", "0.6", "-q")   # commits meanwhile
            assert code == 0, err
            assert not gen.exists()             # nobody held it: deleted at the switch
        real_pin(self, gen)

    monkeypatch.setattr(project_mod.ProjectDir, "_pin", pin_late)
    reader = project_mod.ProjectDir(root)
    assert raced and reader.gen_dir.name not in old and reader.gen_dir.exists()
    assert _gens(root) == [reader.gen_dir.name]
    reader.require_intact()


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> None:
    """Fault injection: the process dies right after `module.name` wrote its file (the worst point: one output
    new, the others old)."""
    import importlib

    mod = importlib.import_module(module)
    real = getattr(mod, name)

    def dying(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(mod, name, dying)


@pytest.mark.parametrize("stage, args, module, name", [
    ("resolve", ("--summary-min-fragments", "1"), "hrag_cli.resolve.stage", "write_outputs"),
    ("synonyms", ("--threshold", "0.5"), "hrag_cli.core.store", "write_jsonl"),
])
def test_interrupted_settings_change_never_mixes(built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 stage: str, args: tuple, module: str, name: str) -> None:
    root, baseline = built
    root = _copy(root, tmp_path / "p")
    before = {rel: (root / rel).read_bytes() for rel in project_files(root) if not rel.startswith("cache/")}
    with monkeypatch.context() as m:
        _interrupt_after(m, module, name)
        code, _, _ = cli(stage, "-p", str(root), *args, "-q")
    assert code == 130
    after = {rel: (root / rel).read_bytes() for rel in project_files(root) if not rel.startswith("cache/")}
    assert after == before            # the interrupted run's outputs never became current
    code, _, err = cli("index", "-p", str(root), "-q")
    assert code == 0, err
    code, got, err = answers(root, FAST)
    assert code == 0 and got == baseline, err


def _wait(pred, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _kill_mid(args: list[str], stub, route: str, meanwhile=None) -> None:
    """Run `hrag ARGS`, call `meanwhile()` while it is mid-stage, then kill -9 it."""
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-dummy"}
    proc = subprocess.Popen([HRAG, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: stub.count(route) >= 2), "the stage never reached the model"
        if meanwhile is not None:
            meanwhile()
        assert proc.poll() is None, "the stage finished before it was killed; make the stub slower"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)


def _slow(fn, delay: float = 0.3):
    def reply(body: dict):
        time.sleep(delay)
        return fn(body)
    return reply


def test_kill_9_during_resolve_with_a_changed_setting(built, stub, tmp_path: Path) -> None:
    root, baseline = built
    root = _copy(root, tmp_path / "p")
    clean = (root / "graph" / "entities.jsonl").read_bytes()
    stub.set_chat(_slow(default_chat))
    _kill_mid(["resolve", "-p", str(root), "--summary-min-fragments", "1", "--llm-model", "openai/stub",
               "--llm-api-base", stub.url, "-q"], stub, CHAT)
    code, _, err = cli("index", "-p", str(root), "-q")
    assert code == 0, err
    assert (root / "graph" / "entities.jsonl").read_bytes() == clean
    code, got, err = answers(root, FAST)
    assert code == 0 and got == baseline, err


def test_kill_9_during_synonyms_with_a_changed_setting(built, stub, tmp_path: Path) -> None:
    root, baseline = built
    root = _copy(root, tmp_path / "p")
    clean = {n: (root / "graph" / n).read_bytes() for n in ("synonyms.jsonl", "graph.pkl")}
    stub.set_embed(_slow(default_embed, 2.0))   # slow enough that the queries below finish mid-stage

    def query_during_the_rebuild() -> None:   # the complete version, never "not built yet" or half of two
        code, got, err = answers(root, FAST)
        assert code == 0 and got == baseline, err

    _kill_mid(["synonyms", "-p", str(root), "--threshold", "0.6", "--embed-model", "openai/stub-embed",
               "--embed-api-base", stub.url, "-q"], stub, EMBED, query_during_the_rebuild)
    code, _, err = cli("index", "-p", str(root), "-q")
    assert code == 0, err
    assert {n: (root / "graph" / n).read_bytes() for n in clean} == clean
    code, got, err = answers(root, FAST)
    assert code == 0 and got == baseline, err


# -- the README's exit-code table, one test per row -----------------------------------------------------------
def test_exit_0_done(built) -> None:
    code, _, err = cli("status", "-p", str(built[0]))
    assert code == 0 and err == ""


def test_exit_1_failed_a_damaged_index_is_refused(built, tmp_path: Path) -> None:
    root = _copy(built[0], tmp_path / "p")
    (root / "graph" / "graph.pkl").unlink()
    code, out, err = cli("query", "flood", "-p", str(root))
    assert code == 1 and out == "" and err.strip().splitlines() == [
        f"hrag: error: graph/graph.pkl is missing: run 'hrag index -p {root}' to rebuild it"]


def test_exit_2_usage_changes_nothing(built, tmp_path: Path) -> None:
    root = _copy(built[0], tmp_path / "p")
    before = sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob("*"))
    code, _, err = cli("index", "-p", str(root), "--top-k", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = cli("index", "-p", str(root), "--chunk-overlap", "-1")
    assert code == 2 and "chunk.overlap" in err
    assert sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob("*")) == before


def _priced_run(stub, tmp_path: Path) -> list[str]:
    """`hrag index` arguments for three one-chunk documents, with a model litellm prices (spend grows)."""
    stub.set_chat(lambda body: "entity<|#|>Company<|#|>organization<|#|>A company in the passage.\n<|COMPLETE|>")
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"Person {i} founded the Company {i} in the town of Place {i}.")
    return ["index", str(docs), "-p", str(tmp_path / "p"), "--llm-model", "openai/gpt-4o-mini", "--llm-api-base",
            stub.url, "--concurrency", "1", "--max-gleanings", "0", "-q"]


def test_exit_3_budget_stop(stub, tmp_path: Path) -> None:
    args = _priced_run(stub, tmp_path)
    code, _, err = cli(*args, "--max-cost", "1e-9")
    assert code == 3 and "run again to continue" in err
    code, _, err = cli("query", "Company 1", "-p", str(tmp_path / "p"))
    assert code == 2 and "not built yet" in err            # no complete version yet: nothing half-built is served
    paid = stub.count(CHAT)
    code, _, err = cli(*args)                               # the same command, no limit: continues
    assert code == 0, err
    assert stub.count(CHAT) == paid + 2                     # the chunk extracted before the stop is not asked again


def test_exit_3_at_max_cost_zero_sends_nothing(stub, tmp_path: Path) -> None:
    """--max-cost 0 (the CLI accepts it): the spend, 0, has reached the budget before the first request."""
    args = _priced_run(stub, tmp_path)
    code, _, err = cli(*args, "--max-cost", "0")
    assert code == 3 and "--max-cost 0" in err and "run again to continue" in err
    assert stub.count(CHAT) == 0
    code, _, err = cli(*args)
    assert code == 0, err
    assert stub.count(CHAT) == 3


def test_exit_75_another_run_holds_the_project(built, tmp_path: Path) -> None:
    """A cron wrapper tells "already running" (75, EX_TEMPFAIL) from "my command is wrong" (2)."""
    import fcntl

    root = _copy(built[0], tmp_path / "p")
    with open(root / "lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.seek(0)
        fh.truncate()
        fh.write("pid 4242")
        fh.flush()
        code, _, err = cli("index", "-p", str(root), "-q")
    assert code == 75 and err.strip().splitlines() == [
        f"hrag: error: project {root} is locked by pid 4242 (another hrag run); nothing was changed, try again "
        f"when it finishes"]


@pytest.mark.parametrize("where", ["resolve.patch:patch_outputs", "resolve.stage:write_outputs"])
def test_exit_130_interrupted_leaves_the_project_as_it_was(built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           where: str) -> None:
    """Killed after the record files were written, before the graph: resolve merging into its saved state
    (patch_outputs), and from scratch (write_outputs: with the state file gone there is nothing to merge into)."""
    root = _copy(built[0], tmp_path / "p")
    current = os.readlink(root / "current")
    if where == "resolve.stage:write_outputs":
        (root / "graph" / "resolve_state.bin").unlink()
    module, name = where.split(":")
    _interrupt_after(monkeypatch, f"hrag_cli.{module}", name)
    code, _, err = cli("resolve", "-p", str(root), "-q")
    assert code == 130 and "interrupted" in err and "run the same command to resume" in err
    assert os.readlink(root / "current") == current


def test_rerunning_a_stage_never_records_a_damaged_file_as_good(built, tmp_path: Path) -> None:
    """`hrag synonyms` is incremental: with a zeroed vector file (the chunk index's sparse values here) it used to keep
    the zeros and record them."""
    root, baseline = built
    root = _copy(root, tmp_path / "p")
    target = (root / "vectors" / "chunks.csc-data.npy").resolve()
    target.write_bytes(b"\0" * target.stat().st_size)
    code, _, err = cli("synonyms", "-p", str(root), "-q")
    assert code == 0 and "vectors/chunks.csc-data.npy is damaged" in err, err
    code, got, err = answers(root, FAST)
    assert code == 0 and got == baseline, err


def test_a_project_from_before_generations_reads_and_moves_into_one(built, tmp_path: Path) -> None:
    root, baseline = built
    old = tmp_path / "old"
    shutil.copytree(root, old, symlinks=True)
    gen = (old / os.readlink(old / "current")).resolve()
    for name in ("manifest.json", "docs.jsonl", "chunks.jsonl", "files.json", "graph", "vectors"):   # old layout
        (old / name).unlink()
        shutil.move(str(gen / name), str(old / name))
    shutil.rmtree(old / "gens")
    (old / "current").unlink()
    code, got, err = answers(old, FAST)
    assert code == 0 and got == baseline, err
    code, _, err = cli("index", "-p", str(old), "-q")
    assert code == 0, err
    assert (old / "current").is_symlink() and (old / "graph").is_symlink()
    code, got, err = answers(old, FAST)
    assert code == 0 and got == baseline, err

"""The command line's contract for scripts: one error line, exit 2 for bad usage, fast help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HRAG = str(Path(sys.executable).with_name("hrag"))


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([HRAG, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_help_exits_zero_and_lists_every_command() -> None:
    res = run("--help")
    assert res.returncode == 0
    for cmd in ("index", "resolve", "synonyms", "query", "eval", "export", "status"):
        assert cmd in res.stdout


def test_help_and_query_startup_do_not_import_litellm_or_torch() -> None:
    code = ("import sys\nfrom hrag_cli import cli\n"
            "try:\n    cli.app(['query', '--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('litellm', 'torch', 'sentence_transformers') if m in sys.modules]\n"
            "sys.exit(1 if bad else 0)\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = [
        ("index", "--chunk-tokens", "abc", str(tmp_path)),
        ("index", "--no-such-flag"),
        ("no-such-command",),
        ("query", "x", "-p", str(tmp_path / "missing")),
        ("status", "-p", str(tmp_path / "missing")),
        ("export", "-f", "graphml", "-o", str(tmp_path / "g.graphml"), "-p", str(tmp_path / "missing")),
    ]
    for args in cases:
        res = run(*args)
        assert res.returncode == 2, (args, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hrag: error: "), (args, res.stderr)
    assert not (tmp_path / "missing").exists()  # read-only commands never create a project


def test_bad_setting_in_toml_is_a_usage_error(tmp_path: Path) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "hrag.toml").write_text("[chunk]\ntokens = 'lots'\n")
    res = run("status", "-p", str(proj))
    assert res.returncode == 2 and "chunk.tokens" in res.stderr


def test_summaries_and_status_print_user_text_as_written(tmp_path: Path, capsys, monkeypatch) -> None:
    """Paths and --select values are data, not rich markup: "[/x]" used to end the command with a MarkupError
    after the work was done, and "[citation needed]" vanished."""
    from typer.testing import CliRunner

    from hrag_cli.cli import _print_summary, app
    from hrag_cli.core.project import ProjectDir

    _print_summary("hrag export [/t]", {"select": "around:[/x]", "output": "out/[citation needed]",
                                        "labels": {"[b]": 1}})
    out = capsys.readouterr().out
    for text in ("hrag export [/t]", "around:[/x]", "out/[citation needed]", "[b]=1"):
        assert text in out, text
    monkeypatch.chdir(tmp_path)
    ProjectDir(Path("[bold]p")).init()
    res = CliRunner().invoke(app, ["status", "-p", "[bold]p"])
    assert res.exit_code == 0, res.output
    assert "hrag project [bold]p" in res.stdout

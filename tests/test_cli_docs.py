"""docs/cli.md is generated from the Typer app: it must match the app, and every option must say what it does."""

from pathlib import Path

from hrag_cli import cli_docs

CLI_MD = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def test_cli_reference_is_current():
    assert CLI_MD.read_text(encoding="utf-8") == cli_docs.render(), \
        "docs/cli.md is stale: run 'make docs' (python -m hrag_cli.cli_docs > docs/cli.md)"


def test_every_command_option_and_argument_has_help():
    assert cli_docs.params_missing_help() == []


def test_reference_lists_every_command_and_option():
    text = CLI_MD.read_text(encoding="utf-8")
    for full, cmd in cli_docs.walk(cli_docs.click_app()):
        if getattr(cmd, "commands", None):
            continue
        assert f"## {full}\n" in text
        for p in cmd.params:
            for opt in p.opts if type(p).__name__.endswith("Option") else []:
                assert f"`{opt}`" in text, f"{full} {opt}"

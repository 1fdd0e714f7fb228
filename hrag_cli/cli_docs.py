"""docs/cli.md made from the Typer app itself, so the reference cannot drift from the flags the code takes.

    python -m hrag_cli.cli_docs > docs/cli.md        (or `make docs`)

Walks the click command tree typer builds: every command in the order the app declares it, its help text, and
each argument and option with its names, type, default and help. tests/test_cli_docs.py fails when the file
in the repository differs from what this prints, or when an option has no help text.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

HEADER = """# Command-line reference

Generated from the code by `python -m hrag_cli.cli_docs` (`make docs`); do not edit by hand. Settings files,
environment variables and exit codes are in the [README](../README.md); the design in [design.md](design.md).
"""


def click_app() -> Any:
    """The click group typer makes of `hrag_cli.cli.app`."""
    import typer.main

    from hrag_cli.cli import app

    return typer.main.get_command(app)


def walk(group: Any, prefix: str = "hrag") -> Iterator[tuple[str, Any]]:
    """(full command name, click command) for every command under `group`, depth first, in declared order."""
    for name, cmd in group.commands.items():
        full = f"{prefix} {name}"
        if getattr(cmd, "commands", None):
            yield full, cmd
            yield from walk(cmd, full)
        else:
            yield full, cmd


def _is_option(param: Any) -> bool:
    return type(param).__name__.endswith("Option")


def _default(param: Any) -> str:
    """The default as a user would type it, or '' when none is worth showing."""
    if getattr(param, "is_flag", False):
        return ""
    if getattr(param, "show_default", None) is False:
        return ""
    value = param.default
    if value is None or value == () or value == []:
        return ""
    if callable(value):
        return ""
    return f"`{value}`"


def _type_name(param: Any) -> str:
    """The value's type as typer names it (str, int, float, Path), or 'flag'."""
    if getattr(param, "is_flag", False):
        return "flag"
    bare = getattr(param, "bare_type", None)
    if callable(bare):
        return str(bare())
    return str(getattr(getattr(param, "type", None), "name", "") or "")


def _metavar(param: Any) -> str:
    return str(param.name).upper()


def _names(param: Any) -> str:
    if _is_option(param):
        return ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    return f"`{_metavar(param)}`"


def _cell(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def params_missing_help() -> list[str]:
    """'hrag CMD --opt' for every option or argument without a help text (the test requires none)."""
    missing = []
    for full, cmd in walk(click_app()):
        for p in cmd.params:
            if not (getattr(p, "help", None) or "").strip():
                missing.append(f"{full} {p.opts[0] if _is_option(p) else _metavar(p)}")
    return missing


def render() -> str:
    app = click_app()
    out = [HEADER]
    out.append(f"`hrag`: {_cell(app.help)}\n")
    out.append("| command | what it does |\n|---|---|")
    for full, cmd in walk(app):
        if not getattr(cmd, "commands", None):
            anchor = full.replace(" ", "-")
            out.append(f"| [`{full}`](#{anchor}) | {_cell(cmd.help).split('. ')[0]} |")
    out.append("")
    for full, cmd in walk(app):
        if getattr(cmd, "commands", None):
            continue
        out.append(f"## {full}\n")
        args = " ".join(_metavar(p) + ("..." if p.nargs == -1 else "") if p.required
                        else f"[{_metavar(p)}{'...' if p.nargs == -1 else ''}]"
                        for p in cmd.params if not _is_option(p))
        out.append(f"    {full} [OPTIONS]{' ' + args if args else ''}\n")
        out.append(_cell(cmd.help) + "\n")
        out.append("| argument / option | type | default | help |\n|---|---|---|---|")
        for p in cmd.params:
            kind = _type_name(p) + (", repeatable" if getattr(p, "multiple", False) else "") + \
                (", required" if p.required else "")
            out.append(f"| {_names(p)} | {kind} | {_default(p)} | {_cell(getattr(p, 'help', '') or '')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()

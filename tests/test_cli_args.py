"""Option values converted without pydantic (cli_args.py): the same values typer gives, the same refusals, and a
command that never imports pydantic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.testing import CliRunner

from hrag_cli.cli_args import install


def _app(seen: dict) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def run(
        name: Annotated[str, typer.Argument()],
        paths: Annotated[Optional[list[Path]], typer.Argument()] = None,
        k: Annotated[Optional[int], typer.Option("--k")] = None,
        x: Annotated[float, typer.Option("--x")] = 0.5,
        flag: Annotated[bool, typer.Option("--flag")] = False,
        env: Annotated[bool, typer.Option("--env", envvar="CLI_ARGS_TEST_ENV")] = False,
        out: Annotated[Optional[Path], typer.Option("--out")] = None,
        tag: Annotated[Optional[list[str]], typer.Option("--tag")] = None,
    ) -> None:
        seen.update(name=name, paths=paths, k=k, x=x, flag=flag, env=env, out=out, tag=tag)

    @app.command()
    def other() -> None:   # two commands, so `run` is a subcommand as hrag's are
        pass

    return app


def test_plain_conversion_gives_typers_values_and_refusals() -> None:
    import typer.core

    install()
    plain = typer.core.build_runtime_param
    install()                                          # once per process, however often it is called
    assert typer.core.build_runtime_param is plain and plain.hrag_plain
    seen: dict = {}
    res = CliRunner().invoke(_app(seen), ["run", "n", "a.txt", "b", "--k", "3", "--x", "2", "--flag", "--out", "o",
                                          "--tag", "t1", "--tag", "t2"], env={"CLI_ARGS_TEST_ENV": "yes"})
    assert res.exit_code == 0, res.output
    assert seen == {"name": "n", "paths": [Path("a.txt"), Path("b")], "k": 3, "x": 2.0, "flag": True, "env": True,
                    "out": Path("o"), "tag": ["t1", "t2"]}
    assert type(seen["x"]) is float and type(seen["k"]) is int
    res = CliRunner().invoke(_app(seen), ["run", "n"], env={"CLI_ARGS_TEST_ENV": "off"})
    assert res.exit_code == 0 and seen["k"] is None and seen["paths"] is None and seen["tag"] is None
    assert seen["env"] is False and seen["x"] == 0.5
    for args, env, word in ((["run", "n", "--k", "abc"], {}, "integer"), (["run", "n", "--x", "1,5"], {}, "number"),
                            (["run", "n"], {"CLI_ARGS_TEST_ENV": "maybe"}, "boolean")):
        res = CliRunner().invoke(_app(seen), args, env=env)
        said = " ".join(res.output.replace("│", " ").split())      # typer may draw the error in a box
        assert res.exit_code == 2 and f"is not a valid {word}" in said, res.output


def test_a_query_never_imports_pydantic(tmp_path: Path) -> None:
    code = ("import sys\nfrom hrag_cli.cli import main\n"
            f"sys.argv = ['hrag', 'query', 'x', '--top-k', '3', '--set', 'query.damping=0.3', '-p', {str(tmp_path)!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print(e.code, 'pydantic' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr      # 2: no project there
    assert "no hrag project" in proc.stderr

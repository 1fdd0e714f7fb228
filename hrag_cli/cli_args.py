"""Option values converted without pydantic, so a command starts fast.

typer converts every option's string through a pydantic TypeAdapter built when the command runs; importing
pydantic for that would be the largest single piece of a cold `hrag query` (more than numpy's import). hrag's
options are str, int, float, bool and Path, or lists of them, which
need nothing of pydantic: `install` makes typer build a plain converter of its own kind
(`typer._coercion.RuntimeParam`) for those, and leaves any other annotation, and a typer without that
contract, to typer's own conversion.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

_NAMES = {int: "integer", float: "number", bool: "boolean"}
_BOOLS = {"1": True, "true": True, "t": True, "yes": True, "y": True, "on": True,
          "0": False, "false": False, "f": False, "no": False, "n": False, "off": False, "": False}
_PLAIN = (str, int, float, bool, Path)


def install() -> None:
    """Route typer's per-parameter converter through `_plain` for plain annotations (once per process)."""
    try:
        import typer.core
        from typer._coercion import RuntimeParam
        from typer._param_types import coerce_cli_path
    except ImportError:          # a typer without this contract converts as it always did
        return
    build = getattr(typer.core, "build_runtime_param", None)
    if build is None or getattr(build, "hrag_plain", False):
        return

    @dataclass(frozen=True)
    class Plain(RuntimeParam):
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, (list, tuple)):
                return [self._one(v, get_args(self.annotation)[0], param, ctx) for v in value]
            return self._one(value, self.annotation, param, ctx)

        def _one(self, value: Any, kind: type, param: Any, ctx: Any) -> Any:
            if kind is str:
                return value if isinstance(value, str) else str(value)
            if kind is Path:
                return coerce_cli_path(Path(value), self.parameter_info, path_type=Path, param=param, ctx=ctx)
            try:
                if kind is bool:     # flags arrive as bools; a value from the environment as text
                    return value if isinstance(value, bool) else _BOOLS[str(value).strip().lower()]
                return kind(value)
            except (TypeError, ValueError, KeyError):
                from typer._click.exceptions import BadParameter

                raise BadParameter(f"{value!r} is not a valid {_NAMES[kind]}.", ctx=ctx, param=param) from None

    def plain(desc: Any) -> Any:
        ann = desc.annotation
        kind = get_args(ann)[0] if get_origin(ann) is list and len(get_args(ann)) == 1 else ann
        info = desc.parameter_info
        if kind in _PLAIN and not desc.is_file and getattr(info, "parser", None) is None and \
                (kind is not Path or getattr(info, "path_type", None) in (None, Path)):
            return Plain(parameter_info=info, annotation=ann)
        return build(desc)

    plain.hrag_plain = True      # type: ignore[attr-defined]
    typer.core.build_runtime_param = plain

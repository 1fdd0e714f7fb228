"""The stage contract: one declared list, every stage bound to its functions, no stage found by name."""

from __future__ import annotations

from pathlib import Path

from hrag_cli.core.config import Settings
from hrag_cli.core.stage_list import DECLARED, OUTPUTS
from hrag_cli.stages import STAGES

PACKAGE = Path(__file__).resolve().parents[1] / "hrag_cli"


def test_every_declared_stage_is_bound_in_order_with_its_outputs() -> None:
    assert [s.name for s in STAGES.values()] == [d.name for d in DECLARED]
    for stage in STAGES.values():
        assert stage.outputs == OUTPUTS[stage.name]
        assert all(up in STAGES and list(STAGES).index(up) < list(STAGES).index(stage.name)
                   for up in stage.upstream)
        assert isinstance(stage.fingerprint(Settings()), str) and stage.fingerprint(Settings())


def test_no_module_is_imported_by_name() -> None:
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "import_module" not in text and "__import__" not in text, path

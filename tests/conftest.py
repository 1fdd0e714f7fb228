"""Shared fixtures: the offline setup, a dummy API key, and the OpenAI-compatible stub server."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # so `from tests.stub_server import ...` works under any pytest import mode
    sys.path.insert(0, str(_ROOT))

from hrag_cli.core import offline  # noqa: E402

offline.setup()
# litellm's OpenAI route wants a key; a dummy one keeps every test offline and keyless.
os.environ["OPENAI_API_KEY"] = "sk-test-dummy"

from tests.stub_server import StubServer  # noqa: E402


@pytest.fixture
def stub() -> Iterator[StubServer]:
    """A fresh stub per test (starting one costs about a millisecond), so scripts never leak between tests."""
    server = StubServer().start()
    try:
        yield server
    finally:
        server.close()


SAMPLE_CORPUS = _ROOT / "sample_corpus"


@pytest.fixture(scope="session")
def sample_project(tmp_path_factory: pytest.TempPathFactory) -> "Path":
    """sample_corpus/ indexed once per session with the offline defaults (rules extractor, builtin embedder).
    Read-only for tests: copy it (shutil.copytree) before changing anything."""
    from hrag_cli import Project

    root = tmp_path_factory.mktemp("sample") / "project"
    assert Project(root).index([SAMPLE_CORPUS]).exit_code == 0
    return root

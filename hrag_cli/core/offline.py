"""Make tiktoken and litellm work with no network, before either is imported.

tiktoken cannot download encodings here, but litellm ships cl100k_base and o200k_base in its tokenizers
folder; litellm fetches its cost map at import unless told to use the local copy.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def setup() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.submodule_search_locations:
        tok = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
        if tok.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(tok)

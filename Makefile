# The two commands of the README: `make demo` and `make test`. Each sets up .venv when it
# is missing and installs what it needs. On a machine without an NVIDIA GPU, torch is
# pinned to the CPU build first (torch==2.13.0), so nothing pulls a multi-GB CUDA build.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.embedlab-installed
TORCH_CPU := torch==2.13.0
# Real English text for the built-in corpus (read by embedlab.sources.builtin).
DEBIAN_SOURCES := bible-kjv bible-kjv-text fortunes dict-foldoc dict-jargon debian-handbook \
	postgresql-doc-15 manpages-dev mythes-en-us
# Real text outside the corpus, for the held-out tasks (`embedlab heldout build`); the others
# (dpkg's status file, GNU Info manuals) come with every Debian system.
HELDOUT_SOURCES := dict-devil

.PHONY: demo test test-fast docs setup debian-sources debian-test-tools clean-venv

demo: setup debian-sources
	$(BIN)/embedlab demo

# The whole suite, what CI runs, on two pytest-xdist workers: every Ray test in one lane on the
# first, the rest on the second (tests/conftest.py, RAY_LANE); it ends with the 25 slowest tests.
test: setup debian-sources debian-test-tools
	$(BIN)/python -m pytest -n 2 --durations=25

# The inner loop: every test that starts no Ray and takes under 10 s (tests/conftest.py marks
# the Ray ones; `slow` marks the few others), with a check that no unmarked test starts Ray;
# on two pytest-xdist workers, a module to a worker.
test-fast: setup debian-sources
	$(BIN)/python -m pytest -n 2 -m "not ray and not slow" --durations=10

# The documentation site (mkdocs-material, API pages from the docstrings) into site/; the
# suite builds it too, with --strict. `python docs/outputs.py` rewrites the command output
# the pages show from the commands themselves.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "setup: NVIDIA GPU found: CUDA torch and faiss-gpu"; \
		$(BIN)/pip install --quiet torch && $(BIN)/pip install --quiet -e ".[gpu,dev]"; \
	else \
		echo "setup: no GPU: $(TORCH_CPU) (CPU build) and faiss-cpu"; \
		$(BIN)/pip install --quiet $(TORCH_CPU) && $(BIN)/pip install --quiet -e ".[cpu,dev]"; \
	fi
	@touch $(STAMP)

# Installs the Debian packages behind the built-in corpus and the held-out tasks when it can (root and apt-get);
# otherwise embedlab runs on the sources present and says which it used.
debian-sources:
	@missing=""; for p in $(DEBIAN_SOURCES) $(HELDOUT_SOURCES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "setup: installing Debian text sources:$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1; } \
		|| echo "setup: could not install$$missing; continuing with the sources present"; \
	else \
		echo "setup: not root or no apt-get; built-in corpus without:$$missing"; \
	fi

# Headless Chromium opens the study report in tests/test_report.py (skipped, saying so, without it).
debian-test-tools:
	@dpkg-query -W -f='$${Status}' chromium 2>/dev/null | grep -q "install ok installed" && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "setup: installing chromium (headless report check)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; } \
		|| echo "setup: could not install chromium; the report's browser test will skip"; \
	else \
		echo "setup: not root or no apt-get; the report's browser test will skip without chromium"; \
	fi

clean-venv:
	rm -rf $(VENV)

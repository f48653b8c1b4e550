# servelab: one entry point for setup, the benchmark and the tests.
# `make bench` and `make test` both build .venv and the collections first (idempotent, stamped).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)
STAMP := $(VENV)/.servelab-stamp
COLL_STAMP := collections/.servelab-stamp
LINT_STAMP := $(VENV)/.servelab-lint-stamp

.PHONY: bench test setup lab-test gpu-test lint clean
bench: setup
	ansible-playbook bench.yml $(ARGS)

# pytest exits 5 when it collected no test: an empty selection must fail loudly, not pass.
test: setup
	python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

setup: $(STAMP) $(COLL_STAMP)

# Lint: ruff (pyproject.toml [tool.ruff]), ansible-lint, and ansible-test sanity on a copy of the
# collection (tools/sanity.py; ignores in tests/sanity/ignore-2.19.txt, each with its reason).
# The lint tools are pinned in requirements-lint.txt, installed into .venv under requirements.txt's
# pins (ansible-core stays 2.19.14); ansible-test builds its own sanity tools' environments.
lint: setup $(LINT_STAMP)
	ruff check .
	ansible-lint -c .ansible-lint
	python tools/sanity.py

$(LINT_STAMP): requirements-lint.txt requirements.txt $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-lint.txt -c requirements.txt
	touch $@

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $@

# The dependencies from requirements.yml, and this checkout itself as servelab.serving (a link),
# so playbooks, ansible-test and pytest resolve `servelab.serving.*` to the working tree.
$(COLL_STAMP): requirements.yml tools/install_collections.py $(STAMP)
	$(BIN)/python tools/install_collections.py requirements.yml collections
	$(BIN)/python tools/collection_link.py collections
	touch $@

# Only the test lab (real LXC containers; needs root).
lab-test: setup
	python -m pytest tests/lab $(PYTEST_ARGS)

# Only the GPU tests (run on a machine with an NVIDIA GPU).
gpu-test: setup
	python -m pytest -m gpu tests/gpu $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) collections .cache .pytest_cache

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

.PHONY: bench test test-integration test-thirdparty test-lab test-all test-noreap test-gpu setup lab-test gpu-test lint docs docs-plugins changelog clean
bench: setup
	ansible-playbook bench.yml $(ARGS)

# The test tiers (README "Tests"); each selects by marker (pyproject.toml), none by folder.
#   test              the fast tier: unit tests and the integration tests marked `core`
#   test-integration  every playbook-level test (tests/integration), the third-party servers
#                     (marker thirdparty: transformers serve on the CPU) included
#   test-thirdparty   only those third-party servers
#   test-lab          the LXC test lab (root)
#   test-all          everything, the lab included: what .ci/run runs
# pytest-xdist runs the tests in TEST_WORKERS processes (`0`: in this process); the lab, the root
# network tests and a module sharing one bench run each keep to one worker (tests/tiers.py).
# pytest exits 5 when it collected no test: an empty selection must fail loudly, not pass.
# One worker more than the cores: much of the suite waits on subprocesses (ansible-playbook, the
# simulator's timed levels), not on a CPU; on 2 cores 3 workers ran the fast tier in 3.5 min
# against 5 min with 2.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
FAST_TIER := (core or not (integration or lab or gpu)) and not (haproxy or root or thirdparty)
pytest = python -m pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests" >&2; exit 1; fi; exit $$rc
XDIST = -n $(TEST_WORKERS) --dist loadgroup

test: setup
	@echo "make test: the fast tier (unit + core integration). Not run here: the other" \
	  "integration tests (make test-integration), the LXC lab (make test-lab, root), GPU" \
	  "tests (make test-gpu); all of them: make test-all"
	$(call pytest,-m "$(FAST_TIER)" $(XDIST) tests)

test-integration: setup
	$(call pytest,-m integration $(XDIST) tests)

# Only the third-party servers (part of test-integration): transformers serve from PyPI on the CPU,
# in its own venv (.cache/thirdparty/, built on first use from tests/integration/thirdparty's pins).
test-thirdparty: setup
	$(call pytest,-m thirdparty $(XDIST) tests)

# The lab sets CI's time (about 40 min of it): its slowest tests are listed at the end.
test-lab: setup
	$(call pytest,-m lab --durations=25 tests)

test-all: setup
	$(call pytest,$(XDIST) tests)

# The fast tier again with PID 1 a process that never reaps orphans (a container whose init is
# `sleep infinity`): whatever takes "/proc/<pid> still there" for "still running" fails here.
# Needs root, or unprivileged user namespaces (then `unshare -r`).
test-noreap: setup
	@if [ "$$(id -u)" = 0 ]; then userns=; else userns=-r; fi; \
	unshare $$userns --fork --pid --mount-proc python tests/noreap_init.py -- \
	  python -m pytest -m "$(FAST_TIER)" $(XDIST) -p no:cacheprovider tests $(PYTEST_ARGS)

# Only the GPU tests (run on a machine with an NVIDIA GPU).
test-gpu: setup
	$(call pytest,-m gpu tests/gpu)

# The names of earlier releases.
lab-test: test-lab
gpu-test: test-gpu

setup: $(STAMP) $(COLL_STAMP)

# Lint: ruff (pyproject.toml [tool.ruff]), the changelog (antsibull-changelog lint), ansible-lint,
# and ansible-test sanity on a copy of the collection (tools/sanity.py; ignores in
# tests/sanity/ignore-2.19.txt, each with its reason).
# The lint tools are pinned in requirements-lint.txt, installed into .venv under requirements-dev.txt's
# pins (ansible-core stays 2.19.14); ansible-test builds its own sanity tools' environments.
lint: setup $(LINT_STAMP)
	ruff check .
	antsibull-changelog lint
	ansible-lint -c .ansible-lint
	python tools/sanity.py

# Generated documentation: each generator in tools/docgen/ rewrites the section it owns (between
# its markers) from the code; tests/unit/test_docs_generated.py fails while one is stale.
DOCGEN := tools/docgen/bench_variables.py tools/docgen/tune_variables.py
docs: setup docs-plugins
	@for gen in $(DOCGEN); do echo "make docs: $$gen"; python $$gen || exit 1; done

# docs/plugins/: every module's and callback's ansible-doc as Markdown (tools/gen_plugin_docs.py;
# tests/unit/test_plugin_docs.py fails when it is stale). Separate from `docs`, which may depend on it.
docs-plugins: setup
	python tools/gen_plugin_docs.py

# CHANGELOG.md from changelogs/changelog.yaml and the unreleased fragments (antsibull-changelog,
# pinned in requirements-lint.txt). A release: `antsibull-changelog release --version X.Y.Z`.
changelog: setup $(LINT_STAMP)
	antsibull-changelog lint
	antsibull-changelog generate

$(LINT_STAMP): requirements-lint.txt requirements-dev.txt $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-lint.txt -c requirements-dev.txt
	touch $@

$(STAMP): requirements-dev.txt requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

# The dependencies from requirements.yml, and this checkout itself as servelab.serving (a link),
# so playbooks, ansible-test and pytest resolve `servelab.serving.*` to the working tree.
$(COLL_STAMP): requirements.yml tools/install_collections.py $(STAMP)
	$(BIN)/python tools/install_collections.py requirements.yml collections
	$(BIN)/python tools/collection_link.py collections
	touch $@

clean:
	rm -rf $(VENV) collections .cache .pytest_cache

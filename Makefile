# healer: the two commands are `make demo` and `make test`; everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv lint test test-unit test-component test-integration demo simulate schema docs verify stack stack-down clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP) ## create .venv and install healer with its dev tools

lint: venv ## ruff, mypy --strict, import-linter
	$(BIN)/ruff check healer tests
	$(BIN)/mypy healer
	$(BIN)/lint-imports

test: lint ## the whole suite (lint first); what CI runs
	$(BIN)/python -m pytest tests

test-unit: venv ## unit tests only (fast)
	$(BIN)/python -m pytest tests/unit

demo: venv ## end-to-end demo on the embedded default scenario
	$(BIN)/healer simulate scenarios/xid79-warm-spare.yaml

schema: venv ## regenerate policies/schema.json
	$(BIN)/healer schema > policies/schema.json

docs: venv ## regenerate generated docs (workflow, XID catalog, policy reference)
	$(BIN)/healer docs --write

verify: venv ## fail if generated files are stale
	$(BIN)/python -m pytest tests/unit/test_generated.py

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .import_linter_cache

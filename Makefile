# healer: the two commands are `make demo` and `make test`; everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv deps slurm-roots operator image lint test test-unit test-integration demo bench schema docs grafana verify stack stack-down clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP) ## create .venv and install healer with its dev tools

deps: ## Debian packages (Slurm, Prometheus), the Slurm 24.11/26.05 roots and the Go-built control plane (cached)
	bash hack/install-system-deps.sh
	bash hack/build-slurm-roots.sh >/dev/null
	bash hack/build-k8s.sh

slurm-roots: ## Slurm 26.05 (Debian sid) and 24.11 (trixie) root filesystems for the local stack (cached; ADR 0017)
	bash hack/build-slurm-roots.sh

operator: ## SchedMD's slurm-operator v1.1.0 and v1.0.0, built from the Go module proxy (cached)
	bash hack/build-operator.sh

image: venv deps ## the controller/agent image from Debian packages and healer's wheel, no container engine (OCI layout + tarball in build/image/; cached; ADR 0011)
	$(BIN)/python -m healer_dev.image --out build/image

lint: venv ## ruff, mypy --strict, import-linter, no import circles
	$(BIN)/ruff check healer healer_dev tests
	$(BIN)/mypy healer healer_dev
	$(BIN)/lint-imports
	$(BIN)/python -m healer_dev.circles healer healer_dev

test: lint deps operator image ## the whole suite (lint first); what CI runs (its 30 slowest tests listed at the end)
	$(BIN)/python -m pytest tests --durations=30

test-unit: venv ## unit and component tests only (fast, no real components)
	$(BIN)/python -m pytest tests/unit tests/component

test-integration: venv deps operator image ## the tests against the real stack only
	$(BIN)/python -m pytest tests/integration

stack: venv deps ## start the local control plane in .devstack/ (detached)
	$(BIN)/python -m healer_dev devstack up

stack-down: venv ## stop it
	$(BIN)/python -m healer_dev devstack down

demo: venv deps ## end to end on the local real stack (SchedMD's operator, built on first use): XID 79 → drain, swap to a warm spare, undrain
	$(BIN)/python -m healer_dev demo

bench: venv deps ## measure healer here: telemetry, engine, real stack, Prometheus path (docs/bench.md)
	$(BIN)/python -m healer_dev bench

schema: venv ## regenerate policies/schema.json
	$(BIN)/healer schema > policies/schema.json

docs: venv ## regenerate generated docs (workflow, XID catalog, policy reference)
	$(BIN)/healer docs --write

grafana: venv ## regenerate dashboards/*.json and the alert files from healer_dev/grafana/ (and the chart's copies)
	$(BIN)/python -m healer_dev grafana

.PHONY: chart-files
chart-files: ## refresh the Helm chart's copies under deploy/helm/healer/files/ (dashboards, alert rules, spare checks)
	rm -f deploy/helm/healer/files/dashboards/*.json
	mkdir -p deploy/helm/healer/files/dashboards
	cp dashboards/*.json deploy/helm/healer/files/dashboards/
	cp deploy/grafana/alerting.yaml deploy/helm/healer/files/grafana-alerting.yaml
	cp deploy/prometheus/healer-rules.yaml deploy/helm/healer/files/healer-rules.yaml
	mkdir -p deploy/helm/healer/files/validation
	cp deploy/validation/*-job.yaml deploy/helm/healer/files/validation/

verify: venv ## fail if generated files are stale
	$(BIN)/python -m pytest tests/unit/test_generated.py

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .import_linter_cache

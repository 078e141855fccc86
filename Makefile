# The two commands: `make dev` (install and run Clarion) and `make test` (the whole suite, as CI runs it).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: dev test install lint bench services browser prometheus chaos

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# The Python client is its own package; the suite tests it against the live API.
	$(PY) -m pip install -q -e clients/python
	touch $@

browser:
	@bash scripts/browser.sh

prometheus:
	@bash scripts/prometheus.sh

services:
	@bash scripts/services.sh

dev: install services
	$(VENV)/bin/clarion dev

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: install services browser prometheus lint
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 2 --dist loadfile

bench: install services
	bash scripts/wrk.sh
	$(PY) -m bench.e2e --reference --pairs 3

# The slow tests, then every chaos scenario at full scale against real processes (~15 min); writes chaos/results.md.
chaos: install services
	$(VENV)/bin/pytest -q -p no:cacheprovider -m slow
	$(PY) -m chaos --out chaos/results.md

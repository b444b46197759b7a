# Set-up is these two targets: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
AMQP_PORT ?= 5672

.PHONY: run test lint unit integration bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	@mkdir -p data
	@echo "mirrorq: starting node n1; connect with amqp://guest:guest@127.0.0.1:$(AMQP_PORT)/ (Ctrl-C stops it)"
	$(VENV)/bin/mirrorq serve --node-id n1 --amqp-port $(AMQP_PORT) --raft-port 25672 \
		--admin-port 15672 --metrics-port 15692 --data-dir data/n1

lint: $(STAMP)
	$(VENV)/bin/ruff check node tests bench
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

integration: $(STAMP)
	$(VENV)/bin/pytest -q tests/integration

test: lint
	$(VENV)/bin/pytest -q -p no:cacheprovider tests

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) data build *.egg-info

# kvstrata: `make serve` starts the server with the default model; `make test` runs the tests.
# Both install what they need into .venv (the torch pin takes the CPU wheel on this machine).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
HOST    ?= 127.0.0.1
PORT    ?= 8000
ARGS    ?=

.PHONY: install serve test fetch-model bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

fetch-model: install
	$(BIN)/kvstrata fetch-model smollm2

serve: install
	$(BIN)/kvstrata serve --model smollm2 --host $(HOST) --port $(PORT) $(ARGS)

test: install fetch-model
	$(BIN)/python -m pytest -q $(ARGS)

bench: install fetch-model
	$(BIN)/kvstrata bench throughput $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis

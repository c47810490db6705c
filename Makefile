# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch that this project is tested with (it lies on disk on the CI image). A plain
# `pip install torch` would pull a multi-GB CUDA build, so torch is installed by exact version, and
# only when the venv has none.
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-floor validate device-prepare bench realsize realsize-clean install clean

$(STAMP): requirements.txt requirements-test.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

# The oldest libraries the pack claims (requirements.txt's floors, each ">=" installed as "=="), beside the
# same CPU torch, in a venv of their own; then the tests that cover loading, caching, training, saving and
# the nodes, and the device check's CPU dry run (a few minutes).
FLOOR_VENV ?= .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.installed
FLOOR_TESTS := tests/engine/test_models.py tests/engine/test_single_file.py tests/engine/test_cache.py tests/engine/test_trainer.py \
	tests/engine/test_lora_files.py tests/canvas/test_nodes.py tests/runs/test_device_check.py

$(FLOOR_STAMP): requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -c "import torch" 2>/dev/null || $(FLOOR_PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	sed -n 's/^\([A-Za-z0-9_.-]*\)>=\(.*\)$$/\1==\2/p' requirements.txt > $(FLOOR_VENV)/floors.txt
	$(FLOOR_PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt -c $(FLOOR_VENV)/floors.txt
	touch $(FLOOR_STAMP)

test-floor: $(FLOOR_STAMP)
	$(FLOOR_PY) -m pytest -q $(FLOOR_TESTS)

# The Comfy registry's checks before publishing (`comfy node validate`: pyproject.toml's fields, ruff's exec/eval
# rules), failing on any warning it prints, then the archive `comfy node publish` would upload, built by comfy-cli's own
# code and checked (tools/registry_archive.py). comfy-cli in a venv of its own; offline once installed, no login.
COMFY_CLI_VERSION ?= 1.23.0
COMFY_CLI_VENV ?= .venv-comfy-cli
COMFY_CLI_STAMP := $(COMFY_CLI_VENV)/.installed

$(COMFY_CLI_STAMP):
	$(PYTHON) -m venv $(COMFY_CLI_VENV)
	$(COMFY_CLI_VENV)/bin/python -m pip install --quiet "comfy-cli==$(COMFY_CLI_VERSION)"
	touch $(COMFY_CLI_STAMP)

validate: $(COMFY_CLI_STAMP)
	$(COMFY_CLI_VENV)/bin/comfy --skip-prompt --no-enable-telemetry node validate > $(COMFY_CLI_VENV)/validate.log 2>&1; \
		status=$$?; cat $(COMFY_CLI_VENV)/validate.log; \
		test $$status -eq 0 && ! grep -qiE "warning|error" $(COMFY_CLI_VENV)/validate.log
	$(COMFY_CLI_VENV)/bin/python tools/registry_archive.py

# The wheels the GPU machine lacks, into benchmarks/.wheels (ignored); prints what will travel (refused over
# 60 MiB). On that machine: `bash benchmarks/device_check.sh` (benchmarks/README.md).
device-prepare:
	PYTHON=$(PYTHON) bash benchmarks/device_check.sh prepare

demo: $(STAMP)
	$(PY) -m trainer_core demo --out demo_out

# Every test, on two worker processes (pytest-xdist; tests/conftest.py gives each one OpenMP thread): the
# tiny models use one core each, so a 2-core machine runs two tests at once. --dist loadfile keeps each test
# file on one worker: a module's shared fixtures (a torchrun launch, real-width models) are built once;
# tests/conftest.py hands out the longest files first (LONGEST_FILES), so that short ones fill the end.
# TEST_WORKERS=0 runs them in this process; `-m "not slow"` (pytest directly) leaves out the longest ones.
TEST_WORKERS ?= 2

# compileall first: where PYTHONDONTWRITEBYTECODE is set (this machine's shells), every new process of the tests would
# otherwise compile the pack's modules from source again (~0.5 s each).
test: $(STAMP)
	$(PY) -m compileall -q trainer_core nodes
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# CPU memory and speed measurements; writes benchmarks/results_cpu.md and .json (a few minutes).
bench: $(STAMP)
	$(PY) benchmarks/memory_cpu.py

# The real 20B model rehearsed on the CPU under a 22 GiB memory cap: writes ~30 GB of random-weight files in
# ComfyUI's real layouts (kept for the next run; `make realsize-clean` deletes them), about 30 minutes.
realsize: $(STAMP)
	$(PY) benchmarks/realsize_cpu.py

realsize-clean: $(STAMP)
	$(PY) benchmarks/realsize_cpu.py --clean-only

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(COMFY_CLI_VENV) demo_out

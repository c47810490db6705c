# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch that this project is tested with (it lies on disk on the CI image). A plain
# `pip install torch` would pull a multi-GB CUDA build, so torch is installed by exact version, and
# only when the venv has none.
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test bench realsize realsize-clean install clean

$(STAMP): requirements.txt requirements-test.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m trainer_core demo --out demo_out

# Every test, on two worker processes (pytest-xdist; tests/conftest.py gives each one OpenMP thread): the
# tiny models use one core each, so a 2-core machine runs two tests at once. --dist loadfile keeps each test
# file on one worker: a module's shared fixtures (a torchrun launch, real-width models) are built once.
# TEST_WORKERS=0 runs them in this process; `-m "not slow"` (pytest directly) leaves out the longest ones.
TEST_WORKERS ?= 2

test: $(STAMP)
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
	rm -rf $(VENV) demo_out

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench bench-ops conformance fuzz sanitize lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# the torch extra too: the torch frontend's tests run in `make test` (torch==2.13.0, a CPU wheel)
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,torch]'
	touch $@

demo: $(VENV)/.installed-test
	$(BIN)/python -m ember.demo

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest

test-all: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m ''

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,torch,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/ember bench --out bench/results --readme bench/README.md

bench-ops: $(VENV)/.installed-bench
	$(BIN)/python bench/ops.py --out bench/results

conformance: $(VENV)/.installed-test
	$(BIN)/python -m ember.conformance --out bench/results/conformance.json

# differential fuzzing against onnxruntime: `make fuzz N=2000 SEED=1` (see tests/fuzz)
N ?= 2000
SEED ?= 1
FUZZ_OUT ?= bench/results/fuzz.json

fuzz: $(VENV)/.installed-test
	$(BIN)/python -m tests.fuzz -n $(N) --seed $(SEED) --out $(FUZZ_OUT)

# every numeric op test, the small compiled models and the VMs with ASan/UBSan in the
# generated code and the native VM
sanitize: $(VENV)/.installed-test
	EMBER_SANITIZE=address,undefined LD_PRELOAD=$$(cc -print-file-name=libasan.so) \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/numerics tests/unit/test_reliability.py \
	tests/models/test_light_compiled.py tests/vm tests/dynamic/test_native_vm.py

lint: $(VENV)/.installed-test
	$(BIN)/pip install -q ruff
	$(BIN)/ruff check ember tests bench

clean:
	rm -rf $(VENV) build *.egg-info

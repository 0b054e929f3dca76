# attngen: the two commands a new user needs are `make generate` and `make test`.
# Both create .venv and install what they use on first run (see pyproject.toml).

ARCH ?= all
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
GEN_STAMP := $(VENV)/.stamp-generate
TEST_STAMP := $(VENV)/.stamp-test
# Where the CPU torch wheel is looked for first (this build machine keeps one on disk).
PIP_FIND := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: generate check test test-gpu sanitize-gpu evidence-compile bench bench-plot review clean-venv

$(GEN_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_FIND) -e .
	@touch $@

$(TEST_STAMP): $(GEN_STAMP) pyproject.toml
	$(PY) -m pip install -q $(PIP_FIND) -e '.[test]'
	@touch $@

## generate: lower every spec into generated/ (ARCH=sm80|sm90|sm100|all)
generate: $(GEN_STAMP)
	$(PY) -m attngen generate --arch $(ARCH)

## check: fail if generated/ differs from what the generator produces (drift)
check: $(GEN_STAMP)
	$(PY) -m attngen generate --arch $(ARCH) --check

## test: the CPU test suite (what CI runs): specs, drift, interpreter numerics, AOT compile
test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 tests

## test-gpu: GPU numerics + CUDA-graph tests (on a CUDA machine; records evidence when
## ATTNGEN_EVIDENCE_OUT is set). Uses the machine's python (torch + triton installed there).
## GPU_TESTS narrows it to some suites (`attngen review` names those a change needs)
GPU_PYTEST_ARGS ?= -n 4
GPU_TESTS ?= tests/families/*/gpu tests/integrations/*/gpu
test-gpu:
	ATTNGEN_GPU=1 $(PYTHON) -m pytest -q -p no:cacheprovider $(GPU_PYTEST_ARGS) $(GPU_TESTS)

## sanitize-gpu: a small GPU suite under compute-sanitizer (memcheck, racecheck), recorded
sanitize-gpu:
	$(PYTHON) tests/gpu_sanitize.py --out evidence/gpu/sanitizer-sm90.json --commit $$(git rev-parse --short HEAD)

## evidence-compile: AOT-compile every generated kernel and record registers/smem/spills
## (kernels whose identity is unchanged keep their recorded rows; AOT_FLAGS= compiles all)
AOT_FLAGS ?= --reuse
evidence-compile: $(TEST_STAMP)
	for a in sm80 sm90 sm100; do env -u TRITON_INTERPRET $(PY) -m attngen.aot --arch $$a --out-dir evidence/compile $(AOT_FLAGS) || exit 1; done
	$(PY) -m attngen generate --arch all

## bench: time every family's generated kernels against its peers on the GPU, one process a
## family (writes bench/results/*.json and, where matplotlib imports, plots). BENCH_FAMILIES
## picks some of mha mla dsa gdn; BENCH_ARGS goes to the MHA bench (bench/run.py). Peers:
## FA4 on PYTHONPATH (/tmp/gpusite), FlashMLA in FLASHMLA=DIR (mla, dsa), SGLang's Triton MLA
## decode file in SGLANG_DECODE=FILE (mla), fla-core 0.6.0 importable (gdn); bench/README.md.
## A family that cannot run here (no GPU, its required peer missing) is listed as not run.
BENCH_ARGS ?=
BENCH_FAMILIES ?= mha mla dsa gdn
FLASHMLA ?=
SGLANG_DECODE ?=
bench:
	@failed=""; notrun=""; for f in $(BENCH_FAMILIES); do echo "== bench $$f"; \
	  case $$f in \
	    mha) $(PYTHON) bench/run.py --out bench/results $(BENCH_ARGS) ;; \
	    mla) $(PYTHON) bench/mla.py --out bench/results $(if $(FLASHMLA),--flashmla $(FLASHMLA)) \
	         $(if $(SGLANG_DECODE),--sglang-decode $(SGLANG_DECODE)) ;; \
	    dsa) $(PYTHON) bench/dsa.py --out bench/results $(if $(FLASHMLA),--flashmla $(FLASHMLA)) ;; \
	    gdn) $(PYTHON) bench/gdn.py --out bench/results ;; \
	    *) echo "bench: unknown family '$$f' (mha mla dsa gdn)"; (exit 1) ;; \
	  esac; rc=$$?; [ $$rc = 2 ] && notrun="$$notrun $$f"; [ $$rc != 0 ] && [ $$rc != 2 ] && failed="$$failed $$f"; \
	done; \
	[ -z "$$notrun" ] || echo "bench: not run here:$$notrun"; \
	[ -z "$$failed" ] || { echo "bench: failed:$$failed"; exit 1; }; \
	[ -z "$$notrun" ]

## bench-plot: plot a bench JSON (default: the newest) as attngen/peer ratios, next to it
bench-plot: $(GEN_STAMP)
	$(PY) -m pip install -q $(PIP_FIND) -e '.[bench]'
	$(PY) bench/plot.py $(BENCH_JSON)

## review: what the working tree changes against BASE (default: the merge base with main):
## variants, matrix cells and why, evidence dropped, commands to run (REVIEW_ARGS=--format md)
BASE ?=
REVIEW_ARGS ?=
review: $(GEN_STAMP)
	$(PY) -m attngen review $(BASE) $(REVIEW_ARGS)

clean-venv:
	rm -rf $(VENV)

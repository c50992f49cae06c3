# Thin wrappers around scripts/install-deps.sh, CMake and CTest.
#   make run   install what is missing, build, make the demo model, serve it
#   make test  the same preparation, then the whole suite (incl. ASan build)
# The build says one line and writes the compiler's output to
# $(BUILD)/build.log (its tail is shown when it fails); VERBOSE=1 shows it.
JOBS    ?= $(shell nproc)
# CMake's own makefiles are sub-makes of this one: no "Entering directory"
MAKEFLAGS += --no-print-directory
BUILD   ?= build
ASAN    ?= build-asan
FUZZ    ?= build-fuzz
TSAN    ?= build-tsan
# Seconds of fuzzing per harness in `make test` (FUZZ_SECONDS=N: the same
# for all); fuzz_gguf, the oldest and the widest, gets more.
FUZZ_SECONDS_DEFAULT ?= 10
FUZZ_SECONDS_gguf ?= 30
fuzz_seconds = $(or $(FUZZ_SECONDS),$(FUZZ_SECONDS_$(1)),$(FUZZ_SECONDS_DEFAULT))
# `make fuzz-long`: each harness this long (seconds)
FUZZ_LONG_SECONDS ?= 600
FUZZERS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
WERROR  := $(if $(SPILLWAY_WERROR),ON,OFF)
DEMO    := $(BUILD)/models/demo.gguf
DEMO_SMALL := $(BUILD)/models/demo-small.gguf
PROMPT  ?= Once upon a time
# CUDA: with an NVIDIA GPU (`nvidia-smi -L` lists one) the main build has
# the cuda:N device and `make run` serves on it (config/cuda.ini; else
# config/demo.ini, a simulated GPU). With the toolkit (nvcc) but no GPU,
# `make test` still compiles a CUDA tree ($(CUDA_BUILD)) so CI proves it builds.
CUDA_BUILD ?= build-cuda
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
NVCC     := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA     := $(if $(HAVE_GPU),ON,OFF)
RUN_CONFIG ?= $(if $(HAVE_GPU),config/cuda.ini,config/demo.ini)
MODELS_CONFIG ?= config/models.ini
# PREBUILT=1: use the binary already in $(BUILD) (no install, no configure,
# no compile), as scripts/newcomer.sh does from inside the test suite.
PREBUILT ?=

.PHONY: all deps build build-asan build-fuzz build-tsan build-cuda demo run run-models generate test test-unit test-asan test-fuzz fuzz-long test-tsan bench clean

all: build

deps:
	@if [ -z "$(PREBUILT)" ]; then scripts/install-deps.sh; fi

build: deps
	@if [ -n "$(PREBUILT)" ]; then \
	  test -x $(BUILD)/spillway || { echo "build: PREBUILT=1 but $(BUILD)/spillway is missing"; exit 1; }; \
	else \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_WERROR=$(WERROR) -DSPILLWAY_CUDA=$(CUDA) >/dev/null || exit 1; \
	  if [ -n "$(VERBOSE)" ]; then cmake --build $(BUILD) -j$(JOBS); else \
	    echo "build: compiling into $(BUILD)/ (output in $(BUILD)/build.log)"; \
	    cmake --build $(BUILD) -j$(JOBS) > $(BUILD)/build.log 2>&1 || \
	    { tail -40 $(BUILD)/build.log; echo "build: FAILED; the whole output: $(BUILD)/build.log"; exit 1; }; fi; \
	fi

# Compile (library, binary, test programs), then test_cuda, whose host
# checks of the kernels' element code need no GPU (its GPU tests skip).
build-cuda: deps
	@if [ -z "$(NVCC)" ]; then echo "build-cuda: no nvcc, the CUDA build is not compiled"; else \
	  cmake -S . -B $(CUDA_BUILD) -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_WERROR=$(WERROR) \
	    -DSPILLWAY_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) >/dev/null && \
	  cmake --build $(CUDA_BUILD) -j$(JOBS) && echo "build-cuda: the CUDA build compiles" && \
	  { $(CUDA_BUILD)/test_cuda > $(CUDA_BUILD)/test_cuda.log 2>&1 || \
	    { tail -40 $(CUDA_BUILD)/test_cuda.log; exit 1; }; } && \
	  echo "build-cuda: test_cuda passes ($(CUDA_BUILD)/test_cuda.log; its GPU tests skip without a GPU)"; fi

build-asan: deps
	@cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DSPILLWAY_SANITIZE=ON -DSPILLWAY_WERROR=$(WERROR) >/dev/null
	@cmake --build $(ASAN) -j$(JOBS)

# ThreadSanitizer, in its own tree: the binary and the router's and the
# worker's tests (test_router_*, test_worker_*), nothing else.
TSAN_TARGETS := spillway test_alloc_sweep test_regex_cache $(patsubst tests/unit/%.c,%,$(wildcard tests/unit/test_router_*.c tests/unit/test_worker_*.c))
build-tsan: deps
	@cmake -S . -B $(TSAN) -DCMAKE_BUILD_TYPE=Debug -DSPILLWAY_TSAN=ON -DSPILLWAY_WERROR=$(WERROR) >/dev/null
	@cmake --build $(TSAN) -j$(JOBS) --target $(TSAN_TARGETS)

# Those tests under TSan. Every process (test, router, workers) writes its
# reports under $(TSAN)/tsan-reports, so a race in a worker fails the run
# too; tests/tsan.supp holds the justified suppressions. Not part of
# `make test` (a third full build: CI's time); docs/operations.md, Testing,
# says when it runs.
TSAN_TESTS ?= ^(test_(router|worker)_|test_regex_cache$$|tsan_alloc_sweep_engine$$)
test-tsan: build-tsan
	@rm -rf $(TSAN)/tsan-reports && mkdir -p $(TSAN)/tsan-reports
	@cd $(TSAN) && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp log_path=$(abspath $(TSAN))/tsan-reports/report second_deadlock_stack=1" \
	  ctest --output-on-failure -j$(JOBS) -R '$(TSAN_TESTS)'; rc=$$?; \
	  if ls tsan-reports/report.* >/dev/null 2>&1; then \
	    cat tsan-reports/report.* | head -200; \
	    echo "test-tsan: ThreadSanitizer reports in $(TSAN)/tsan-reports"; exit 1; fi; \
	  exit $$rc

# libFuzzer harnesses (tests/fuzz/fuzz_*.c), built with clang in their own tree.
build-fuzz: deps
	@CC=clang cmake -S . -B $(FUZZ) -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ) -j$(JOBS) --target $(addprefix fuzz_,$(FUZZERS))

# The demo model: deterministic pseudo-random weights, built-in vocabulary.
$(DEMO): | build
	@mkdir -p $(dir $(DEMO))
	@echo "demo: making $(DEMO)"
	@$(BUILD)/spillway model make -o $(DEMO) --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 768 --vocab 2048 --type q8_0 --seed 1 >/dev/null

# The smaller model of config/models.ini (its capacity fallback).
$(DEMO_SMALL): | build
	@mkdir -p $(dir $(DEMO_SMALL))
	@echo "demo: making $(DEMO_SMALL)"
	@$(BUILD)/spillway model make -o $(DEMO_SMALL) --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 384 --vocab 2048 --type q8_0 --seed 2 >/dev/null

demo: build $(DEMO)

# The main job: the router with one GPU worker and one CPU worker on
# 127.0.0.1:8080, until Ctrl-C: cuda:0 when there is a GPU (config/cuda.ini),
# else a simulated GPU (config/demo.ini). `make run-models`: two models on
# one simulated GPU (config/models.ini), on 127.0.0.1:8090, so that both
# can run at once (each has its own state directory and pool).
run: demo
	@$(BUILD)/spillway serve --config $(RUN_CONFIG)

run-models: demo $(DEMO_SMALL)
	@$(BUILD)/spillway serve --config $(MODELS_CONFIG)

# A one-shot generation on the demo model.
generate: demo
	$(BUILD)/spillway run -m $(DEMO) -p "$(PROMPT)" -n 32

test-unit: demo
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-asan: build-asan
	@cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS) -LE no-asan

# A short real fuzzing run per harness, on a copy of its seed corpus in the
# build tree: new inputs and crash files never land in the source tree
# (scripts/fuzz-run.sh; it prints executions and coverage per harness).
test-fuzz: build-fuzz
	@scripts/fuzz-run.sh $(FUZZ) $(foreach f,$(FUZZERS),$(f)=$(call fuzz_seconds,$(f)))

# Every harness for FUZZ_LONG_SECONDS (10 minutes) each, one after the
# other (about 1.7 hours): the long run docs/operations.md, Fuzzing, asks
# for before a release. FUZZERS="http_head sse" runs some only.
fuzz-long: build-fuzz
	@scripts/fuzz-run.sh $(FUZZ) $(foreach f,$(FUZZERS),$(f)=$(FUZZ_LONG_SECONDS))

test: test-unit test-asan test-fuzz build-cuda

bench: build
	bench/engine.sh

clean:
	rm -rf $(BUILD) $(ASAN) $(FUZZ) $(TSAN) $(CUDA_BUILD)

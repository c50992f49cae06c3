# Thin wrappers around scripts/install-deps.sh, CMake and CTest.
#   make run   install what is missing, build, make the demo model, generate
#   make test  the same preparation, then the whole suite (incl. ASan build)
JOBS    ?= $(shell nproc)
BUILD   ?= build
ASAN    ?= build-asan
WERROR  := $(if $(SPILLWAY_WERROR),ON,OFF)
DEMO    := $(BUILD)/models/demo.gguf
PROMPT  ?= Once upon a time

.PHONY: all deps build build-asan demo run test test-unit test-asan bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_WERROR=$(WERROR) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

build-asan: deps
	@cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DSPILLWAY_SANITIZE=ON -DSPILLWAY_WERROR=$(WERROR) >/dev/null
	@cmake --build $(ASAN) -j$(JOBS)

# The demo model: deterministic pseudo-random weights, built-in vocabulary.
$(DEMO): | build
	@mkdir -p $(dir $(DEMO))
	$(BUILD)/spillway model make -o $(DEMO) --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 768 --vocab 2048 --type q8_0 --seed 1

demo: build $(DEMO)

run: demo
	$(BUILD)/spillway run -m $(DEMO) -p "$(PROMPT)" -n 32

test-unit: demo
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-asan: build-asan
	@cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS) -LE no-asan

test: test-unit test-asan

bench: build
	bench/engine.sh

clean:
	rm -rf $(BUILD) $(ASAN)

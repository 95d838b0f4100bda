# Ember's front door. `make demo` and `make test` install what is missing, build, and run.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
BUILD_TYPE ?= RelWithDebInfo

# ccache: share hits between clones in different folders (CI builds a fresh clone).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
export CCACHE_MAXSIZE ?= 5G

.PHONY: all deps configure build test tsa demo bench asan fuzz clean format

all: build

deps:
	@tools/install-deps.sh

# `make build` only builds (what it needs must be there: `make deps`, or the first `make test` /
# `make demo`, installs it).
configure:
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_EXTRA) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: deps
	@$(MAKE) --no-print-directory build tsa
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# clang's thread-safety analysis over every library and the ember binary: a field read or written
# without the lock that guards it (ABSL_GUARDED_BY) is a build error.
tsa:
	@CC=clang CXX=clang++ cmake -S . -B build-tsa -G Ninja -DCMAKE_BUILD_TYPE=Debug \
		-DEMBER_THREAD_SAFETY=ON > /dev/null
	@cmake --build build-tsa -j $(JOBS) --target ember

demo: deps
	@$(MAKE) --no-print-directory build
	@tools/demo.sh $(BUILD_DIR)/bin/ember

bench: deps
	@$(MAKE) --no-print-directory build
	@bench/bench.sh $(BUILD_DIR)

# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build dir.
asan: deps
	@$(MAKE) test BUILD_DIR=build-asan BUILD_TYPE=Debug CMAKE_EXTRA=-DEMBER_SANITIZE=ON

# libFuzzer targets (clang, ASan+UBSan) in their own build dir, each run FUZZ_SECONDS.
FUZZ_SECONDS ?= 60
fuzz: deps
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DEMBER_FUZZ=ON > /dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_wire fuzz_manifest fuzz_index_record fuzz_units
	@tools/fuzz.sh build-fuzz $(FUZZ_SECONDS)

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD_DIR) build-asan build-fuzz build-tsa

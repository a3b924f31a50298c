# cudapool — `make` builds everything, `make test` runs the tests (no GPU needed),
# `make bench` runs the CPU benchmarks, `make fuzz` runs the fuzzers (clang), `make docs`
# writes the policy-key tables of README.md and docs/policy.md from config/keys.def,
# `make install PREFIX=/usr/local [DESTDIR=/staging]` (stripped; `make uninstall` with the same
# variables removes it again). Sanitizers: `make test SAN=address,undefined` or SAN=thread.
# `make ci-sanitize` runs both. `make WERROR=1` turns warnings into errors.
# `make format` / `make format-check` / `make editorconfig-check`: source style (.clang-format).
# Each directory describes its own targets in module.mk; this file holds the shared rules.

comma := ,
SAN ?=
ifeq ($(SAN),)
  BUILD := build/release
  OPT := -O2 -g
else
  BUILD := build/san-$(subst $(comma),-,$(SAN))
  # -g1: line tables, all a sanitizer's report needs, at a fraction of full debug info's compile
  # time. AddressSanitizer+UBSan at -Og: at -O1 UBSan's checks about double a file's compile time.
  OPT := $(if $(findstring thread,$(SAN)),-O1,-Og) -g1 -fsanitize=$(SAN) -fno-omit-frame-pointer \
         -fno-sanitize-recover=all
endif

CXX ?= g++
PREFIX ?= /usr/local
# spdlog and fmt as declarations only: their compiled parts are built once, in
# telemetry/spdlog_fmt_impl.cpp, not again in every file that logs (see that file for why not
# Debian's shared libraries).
CPPFLAGS := -I. -DSPDLOG_COMPILED_LIB
# Warnings: shadowing and implicit narrowing or sign changes too; `make WERROR=1` makes every
# warning an error (the programs built with fixed flags in tests/mk/ use WARNFLAGS as well).
WERROR ?=
WARNFLAGS := -Wall -Wextra -Wshadow -Wconversion -Wsign-conversion $(if $(filter 1,$(WERROR)),-Werror)
CXXFLAGS := -std=c++20 $(OPT) $(WARNFLAGS) -fPIC -pthread
LDFLAGS := -pthread $(if $(SAN),-fsanitize=$(SAN))
DEPFLAGS = -MMD -MP
# Quiet by default: one short line per step; `make V=1` shows every command.
V ?= 0
ifeq ($(V),0)
  Q := @
  say = @printf '  %-6s %s\n' $(1) $(2);
else
  Q :=
  say =
endif

# Filled in by the module.mk files.
PROGRAMS :=       # built by `make`
TEST_BINS :=      # run by `make test` (GoogleTest binaries or scripts that exit non-zero on failure)
BENCH_BINS :=     # run by `make bench`
FUZZ_TARGETS :=   # run by `make fuzz`
INSTALL_LIBS :=   # installed into $(PREFIX)/lib
INSTALL_BINS :=   # installed into $(PREFIX)/bin
INSTALL_HEADERS := # installed into $(PREFIX)/include

.PHONY: all programs test bench fuzz install uninstall clean deps demo format format-check editorconfig-check \
        ci-sanitize
all: programs

include allocator/module.mk
include sys/module.mk
include config/module.mk
include telemetry/module.mk
include shim/module.mk
include tools/module.mk
include tests/module.mk

programs: $(PROGRAMS)

# The demo: says up front what the first build costs, builds quietly, then runs tools-demo.
DEMO_BUILD_NOTE ?= about 4–5 minutes on 2 cores
demo:
	@echo "cudapool demo: building the programs first ($(DEMO_BUILD_NOTE) the first time; V=1 shows each command)"
	@$(MAKE) -s --no-print-directory programs
	@$(MAKE) --no-print-directory tools-demo

$(BUILD)/%.o: %.cpp
	@mkdir -p $(@D)
	$(call say,CXX,$<)$(CXX) $(CPPFLAGS) $(CXXFLAGS) $(DEPFLAGS) -c $< -o $@

test: $(PROGRAMS) $(TEST_BINS)
	@bash tests/run_tests.sh $(TEST_BINS)

# Both sanitizer builds' tests, one after the other, each in its own tree (build/san-*): what CI
# runs after `make test` (`make -j2 ci-sanitize`).
ci-sanitize:
	@$(MAKE) --no-print-directory test SAN=address,undefined
	@$(MAKE) --no-print-directory test SAN=thread

bench: $(BENCH_BINS)
	@set -e; for b in $(BENCH_BINS); do echo "== $$b"; $$b; done

# Every fuzzer is built first; then each runs FUZZ_TIME seconds on one core (`make -j2 fuzz` runs
# two at a time), printing its last lines when it ends. CI runs 10 s each; a longer run is
# `make -j2 fuzz FUZZ_TIME=600` (docs/benchmarks.md, "Fuzzing"). Each starts from its committed
# seeds, tests/fuzz/corpus/<target>/, and what it found before, $(BUILD)/fuzz-corpus/<target>/
# (where new inputs go); a crashing input lands in $(BUILD)/fuzz-artifacts/.
FUZZ_TIME ?= 30
FUZZ_RUNS := $(FUZZ_TARGETS:%=%.run)
.PHONY: fuzz $(FUZZ_RUNS)
fuzz: $(FUZZ_RUNS)
# The whole output goes to $(BUILD)/fuzz-logs/<target>.log; shown are the coverage and feature
# counts when it loaded its corpus and when it ended, and the runs (the log's end on a failure).
$(FUZZ_RUNS): %.run: % | $(FUZZ_TARGETS)
	@n=$(notdir $*); mkdir -p $(BUILD)/fuzz-corpus/$$n $(BUILD)/fuzz-artifacts $(BUILD)/fuzz-logs; \
	  seeds=; [ -d tests/fuzz/corpus/$$n ] && seeds=tests/fuzz/corpus/$$n; log=$(BUILD)/fuzz-logs/$$n.log; \
	  $* -max_total_time=$(FUZZ_TIME) -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=$(BUILD)/fuzz-artifacts/ $(BUILD)/fuzz-corpus/$$n $$seeds >$$log 2>&1; rc=$$?; \
	  if [ $$rc -eq 0 ]; then \
	    out=$$(grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^Done |^stat::(number_of_executed_units|new_units_added)' $$log); \
	  else out=$$(tail -n 40 $$log); fi; \
	  printf '== %s (%s s)\n%s\n' $* $(FUZZ_TIME) "$$out"; exit $$rc

# Installed stripped (debug info stays in the build tree); a pkg-config file for cudapool.h.
VERSION := $(shell sed -n 's/.*kVersion\[\] = "\(.*\)";/\1/p' config/version.h)
STRIP ?= strip
DEST = $(DESTDIR)$(PREFIX)
INSTALLED = $(addprefix $(DEST)/lib/,$(notdir $(INSTALL_LIBS))) $(addprefix $(DEST)/bin/,$(notdir $(INSTALL_BINS))) \
            $(addprefix $(DEST)/include/,$(notdir $(INSTALL_HEADERS))) $(DEST)/lib/pkgconfig/cudapool.pc
install: $(PROGRAMS)
	install -d $(DEST)/lib/pkgconfig $(DEST)/bin $(DEST)/include
	$(if $(INSTALL_LIBS),install -m 755 $(INSTALL_LIBS) $(DEST)/lib)
	$(if $(INSTALL_LIBS),$(STRIP) --strip-unneeded $(addprefix $(DEST)/lib/,$(notdir $(INSTALL_LIBS))))
	$(if $(INSTALL_BINS),install -m 755 -s --strip-program=$(STRIP) $(INSTALL_BINS) $(DEST)/bin)
	$(if $(INSTALL_HEADERS),install -m 644 $(INSTALL_HEADERS) $(DEST)/include)
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: cudapool\nDescription: caching CUDA device-memory pool preloaded in front of CUDA programs (C API)\nVersion: %s\nLibs: -L$${libdir} -lcudapool\nCflags: -I$${includedir}\n' \
	  '$(PREFIX)' '$(VERSION)' > $(DEST)/lib/pkgconfig/cudapool.pc

uninstall:
	rm -f $(INSTALLED)

clean:
	rm -rf build

# Source style (.clang-format, .editorconfig): `make format` rewrites the C++/CUDA sources in
# place; `make format-check` lists the files clang-format would change and fails if any;
# `make editorconfig-check` checks final newlines, trailing whitespace and tabs in C++.
CLANG_FORMAT ?= clang-format
format:
	$(call say,FORMAT,.clang-format)git ls-files -z '*.cpp' '*.h' '*.cu' | xargs -0 $(CLANG_FORMAT) -i --style=file
format-check:
	@CLANG_FORMAT=$(CLANG_FORMAT) bash scripts/check_format.sh
editorconfig-check:
	@bash scripts/check_editorconfig.sh

deps:
	bash scripts/setup.sh

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The two commands a fresh machine needs: `make demo` and `make test`.
# Each creates .venv if missing and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_DEV := $(VENV)/.installed-dev-spark
STAMP_BENCH := $(VENV)/.installed-dev-spark-bench
# The C accelerators (setup.py, ambrosia_py/accel.py): an install compiles them in place
# where a C compiler is found; the tests then require them (a broken build fails `make
# test`), and elsewhere run the pure-Python twins.
ACCEL := setup.py $(wildcard ambrosia_py/*/_c*.c ambrosia_py/*/*/_c*.c)
REQUIRE_ACCEL := $(if $(shell command -v cc 2>/dev/null),1,0)
# They build against OpenSSL's libcrypto (HMAC-SHA256) and the system's xxHash (XXH64,
# XXH3): where a compiler is found and those headers are not, an install step fetches
# Debian's packages first, and says so in one line.
ACCEL_DEBS := libssl-dev libxxhash-dev
ACCEL_DEPS = if [ $(REQUIRE_ACCEL) = 1 ] && command -v apt-get >/dev/null && \
	! dpkg -s $(ACCEL_DEBS) >/dev/null 2>&1; then \
	echo "installing $(ACCEL_DEBS): the C accelerators' OpenSSL and xxHash headers"; \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	$(ACCEL_DEBS); } >/dev/null 2>&1 || echo "apt-get failed: the accelerators will not build"; fi

# The etcd registry's tests run a real etcd (tests/etcd_server.py): where the command is
# missing, Debian's etcd-server is installed, and this says so in one line.
ETCD_DEPS = if ! command -v etcd >/dev/null && command -v apt-get >/dev/null; then \
	echo "installing etcd-server: the etcd registry's tests run a real etcd"; \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	etcd-server; } >/dev/null 2>&1 || echo "apt-get failed: the etcd registry tests will skip"; fi

.PHONY: demo test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# After pyproject.toml changes the install is redone: its entry points (the plug-ins of
# immortals/, docs/architecture.md) live in the installed metadata, not in the source.
$(STAMP_DEV): $(BIN)/python pyproject.toml $(ACCEL)
	@$(ACCEL_DEPS)
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	touch $@

# Spark (the `spark` extra, tests/test_spark_*.py) needs a Java runtime; without one those
# tests skip and this says, in one line, how to get it.
JAVA_CHECK = command -v java >/dev/null 2>&1 || [ -x "$$JAVA_HOME/bin/java" ] || \
	echo "no java: the Spark tests will skip; to run them: apt-get install openjdk-17-jre-headless"

# The main job (docs/demo.md): producer -> Ockam hub -> Wallaroo connector -> worker, every
# process SIGKILLed mid-stream, checked for exactly once, then Spark over the logs (without
# java the demo says what to install and still runs and checks the pipeline).
demo: $(STAMP_DEV)
	$(BIN)/ambrosia-py demo

test: lint typecheck unit

lint: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP_DEV)
	$(BIN)/mypy

unit: $(STAMP_DEV)
	@$(JAVA_CHECK)
	@$(ETCD_DEPS)
	AMBROSIA_REQUIRE_ACCEL=$(REQUIRE_ACCEL) $(BIN)/pytest -q

# Ours beside the peers (gRPC, DBOS, Restate's SDK, Temporal: the `bench` extra; Restate's
# server from npm, into .bench-peers/, which this Makefile owns) and this machine's limits,
# in one run (docs/performance.md); `make bench BENCH_ARGS=--quick` for a fast check.
# Where npm or strace (which counts each party's syncs) is missing, Debian's is installed,
# and this says so in one line; a peer that still cannot be installed is skipped by name.
PEERS_DIR := .bench-peers
RESTATE_SERVER := @restatedev/restate-server@1.7.12
BENCH_DEBS = for deb in npm strace; do \
	if ! command -v $$deb >/dev/null && command -v apt-get >/dev/null; then \
	echo "installing $$deb: bench compare runs Restate's server from npm and counts syncs with strace"; \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	$$deb; } >/dev/null 2>&1 || echo "apt-get failed: bench compare goes on without $$deb"; fi; done
RESTATE_INSTALL = { command -v npm >/dev/null && npm install --prefix $(PEERS_DIR) --no-audit \
	--no-fund --silent --save-exact $(RESTATE_SERVER) >/dev/null; } || \
	echo "npm install $(RESTATE_SERVER) failed: bench compare will skip Restate"

$(STAMP_BENCH): $(BIN)/python pyproject.toml Makefile $(ACCEL)
	@$(ACCEL_DEPS)
	@$(BENCH_DEBS)
	$(BIN)/pip install --quiet -e '.[dev,spark,bench]'
	@mkdir -p $(PEERS_DIR) && $(RESTATE_INSTALL)
	touch $@

bench: $(STAMP_BENCH)
	$(BIN)/ambrosia-py bench compare $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis $(PEERS_DIR)

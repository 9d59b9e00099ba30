# The README's commands. Each target creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
SUDO := $(if $(filter 0,$(shell id -u)),,sudo -n)

.PHONY: demo test lint typecheck unit docs bench chaos clean kcat bytecode kafkajs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The project's own bytecode, beside its sources: an editable install leaves it to the
# first import, and where PYTHONDONTWRITEBYTECODE=1 (many containers) nothing ever
# writes it, so every command compiled broker/ and cli/ again (233 ms of CPU for one
# produce, 7.7x python -c pass). Only what changed is compiled again.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q broker cli

demo: $(STAMP) bytecode
	PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/demo.sh
	@echo
	@echo "fencelog is installed in .venv. To put it on your PATH in this shell, run:"
	@echo "    . .venv/bin/activate"

test: lint typecheck unit

# The project's own code: what a user pastes from README into the checkout (a
# test_shipping.py, say) is theirs, not linted.
LINTED := broker cli tests bench chaos examples

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

# Two pytest-xdist workers: most tests wait on processes, servers and timeouts, so two
# of them overlap on two cores (a run of one process: 21 min; of two: 13 min). Tests
# marked `alone` (the chaos suite's seed) run after, in one process.
unit: $(STAMP) bytecode kcat kafkajs
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -n 2 -m "not alone" --durations=10
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -m alone

# kcat, Debian's Kafka command-line client, for tests/kafka_listener; without it those
# tests skip and say why.
kcat:
	@command -v kcat >/dev/null 2>&1 || \
		{ $(SUDO) apt-get install -y -qq kcat || \
		{ $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq kcat; }; } \
		>/dev/null 2>&1 || \
		echo "make: kcat is missing and apt-get could not install it;" \
			"its tests will be skipped" >&2

# KafkaJS, a Kafka client in JavaScript, for tests/kafka_listener/test_kafkajs.py, from npm
# at the version its package-lock.json names; without Node's npm those tests skip.
KAFKAJS := tests/kafka_listener/kafkajs
kafkajs: $(KAFKAJS)/node_modules/.package-lock.json

$(KAFKAJS)/node_modules/.package-lock.json: $(KAFKAJS)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd $(KAFKAJS) && npm ci --no-audit --no-fund --silent || \
			echo "make: npm could not install KafkaJS; its tests will be skipped" >&2; \
	else \
		echo "make: npm is missing; the KafkaJS tests will be skipped" >&2; \
	fi

docs: $(STAMP)
	$(BIN)/python -m cli.docs write

# The benchmarks' extra (nats-py) and, if missing, Debian's nats-server for the NATS
# JetStream baseline; without it bench/ skips that baseline and says so.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	@command -v nats-server >/dev/null 2>&1 || test -x /usr/sbin/nats-server || \
		{ $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq nats-server; } \
		>/dev/null 2>&1 || \
		echo "make bench: nats-server is missing and apt-get could not install it;" \
		"the NATS JetStream comparison will be skipped" >&2
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench.run

# The fault suite (README, "The fault suite"): DURATION seconds (default 300) of faults
# with a random seed, printed; SEED=N replays a run. `make test` runs a small seed.
chaos: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m chaos --duration $(or $(DURATION),300) \
		$(if $(SEED),--seed $(SEED))

clean:
	rm -rf $(VENV) .fencelog .mypy_cache .ruff_cache .pytest_cache $(KAFKAJS)/node_modules

# mirrorflow — everything a newcomer needs is `make demo` and `make test`.
# Each target sets up what is missing (venv in .venv, Java artifacts in .cache) and reuses it next time.

PYTHON   ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
export MIRRORFLOW_CACHE ?= $(CURDIR)/.cache

.PHONY: help venv artifacts demo airflow test test-unit test-integration lint bench up down status clean

help:
	@echo "make demo   - local Kafka clusters + registries; the generated Airflow DAGs mirror sample Avro data and fail over"
	@echo "make airflow - airflow standalone (UI on :8080) with the DAGs and the Mirrors page on the local clusters"
	@echo "make test   - install everything needed, lint, and run the whole test suite"
	@echo "make lint   - ruff + mypy + import rule"
	@echo "make bench  - throughput/latency benchmark (mirrorflow vs MirrorMaker 2 vs raw pipe)"

$(STAMP): pyproject.toml constraints.txt setup.py mirror_core/_native.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[airflow,spark,dev]"
	@# the Spark provider pulls pyspark-client into the same `pyspark` package; make sure full pyspark won
	$(BIN)/python -c "import pathlib, pyspark; p = pathlib.Path(pyspark.__file__).parent; \
	  assert list((p / 'jars').glob('spark-core_*.jar')), 'pyspark is the thin client, not full pyspark'; \
	  print('full pyspark', pyspark.__version__)"
	@touch $@

venv: $(STAMP)

artifacts: $(STAMP)
	$(BIN)/mirrorflow local fetch

test: artifacts lint
	$(BIN)/python -m pytest -q --durations=25

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-integration: artifacts
	$(BIN)/python -m pytest -q tests/integration

lint: $(STAMP)
	$(BIN)/ruff check mirror_core spark_jobs tests bench
	$(BIN)/mypy

demo: artifacts
	$(BIN)/python -m mirrorflow_airflow.demo

airflow: artifacts
	$(BIN)/python -m mirrorflow_airflow.standalone

bench: artifacts
	$(BIN)/python bench/run.py

up: artifacts
	$(BIN)/mirrorflow local up

down: $(STAMP)
	$(BIN)/mirrorflow local down

status: $(STAMP)
	$(BIN)/mirrorflow local status

clean: down
	rm -rf .state

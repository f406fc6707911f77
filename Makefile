# ragpipe: the two commands a user needs are `make demo` and `make test`.
.PHONY: setup demo test test-fast docs lint bench bench-scale clean prefect-server prefect-deploy prefect-worker

export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export PREFECT_LOGGING_EXTRA_LOGGERS ?= ragpipe
export PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW ?= ignore
export DO_NOT_TRACK ?= 1
export HF_HUB_OFFLINE ?= 1
export NO_MKDOCS_2_WARNING ?= 1

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
	.venv/bin/mkdocs build --strict --quiet
	.venv/bin/pytest

# The unit tests only (no full ingest, model, server or Prefect): under a minute.
test-fast: setup
	.venv/bin/pytest -m "not slow and not integration"

# The user guide (docs/, mkdocs-material) into build/site; `.venv/bin/mkdocs serve` to browse.
docs: setup
	.venv/bin/mkdocs build --strict

bench: setup
	.venv/bin/python bench/convert.py
	.venv/bin/python bench/convert_formats.py
	.venv/bin/python bench/index.py
	.venv/bin/python bench/publish.py --json bench/results/publish.json
	.venv/bin/python bench/query.py
	.venv/bin/python bench/modes.py
	.venv/bin/python bench/eval.py
	.venv/bin/python bench/ci_coverage.py
	.venv/bin/python bench/fetch.py
	.venv/bin/python bench/cold_start.py
	.venv/bin/python bench/retrieval_quality.py
	.venv/bin/python bench/retrieval_quality.py --embedder all-mpnet-base-v2 --json bench/results/retrieval_quality_mpnet.json
	.venv/bin/python bench/section_evidence.py
	.venv/bin/python bench/section_evidence.py --embedder all-mpnet-base-v2
	.venv/bin/python bench/cache_threshold.py
	.venv/bin/python bench/serve.py
	.venv/bin/python bench/golden_draft.py
	.venv/bin/python bench/llm_rerank.py

# Not in CI, nor in `make bench`: about 1.5 h on 2 cores (1M chunks, four stores).
bench-scale: setup
	.venv/bin/python bench/scale.py

# Deployments (see README "Deployments"): a local Prefect server, the work pool and
# deployments from prefect.yaml, and a process worker. Run server and worker in
# their own terminals. Only these targets talk to that server (demo and test
# keep Prefect's ephemeral mode); set PREFECT_API_URL to use another server.
# RAGPIPE_HOME is unset while deploying: Prefect then keeps {{ $RAGPIPE_HOME }} in the
# pull step, for each worker to fill from its own (prefect-worker: this checkout).
PREFECT_SERVER_URL ?= http://127.0.0.1:4200/api
prefect-deploy prefect-worker: export PREFECT_API_URL ?= $(PREFECT_SERVER_URL)

prefect-server: setup
	.venv/bin/prefect server start --host 127.0.0.1 --port 4200

prefect-deploy: setup
	.venv/bin/prefect work-pool create ragpipe-process --type process --overwrite
	index=$$(.venv/bin/python -m flows.events) && RAGPIPE_INDEX_ID=$$index \
	  env -u RAGPIPE_HOME .venv/bin/prefect --no-prompt deploy --all

prefect-worker: setup
	RAGPIPE_HOME=$(CURDIR) .venv/bin/prefect worker start --pool ragpipe-process

clean:
	rm -rf data/work .pytest_cache .mypy_cache .ruff_cache

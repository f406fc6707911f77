"""Index versions by hand, as a deployment: promote a held (or earlier) version."""

from __future__ import annotations

from prefect import flow

from flows.events import emit_index_decision
from flows.logs import library_logs
from ragpipe.evaluation.forms import run_config
from ragpipe.ingest.gatekeep import Decision, promote_by_hand


@flow(name="promote-index", log_prints=False)
def promote_index_flow(version: str, config_path: str | None = None) -> Decision:
    """Make an index version live by hand (a held one, or the one a promotion replaced).

    Args:
        version: The version or a unique prefix of it (`ragpipe index list`).
        config_path: YAML config (default: ragpipe.yaml in the worker's directory,
            RAGPIPE_HOME).
    """
    library_logs()
    config = run_config(config_path)
    decision = promote_by_hand(config, version)
    emit_index_decision(config, decision, config_path)
    return decision

"""ragpipe's Prefect events: what automations and triggers in prefect.yaml react to.

- ``ragpipe.index.promoted``: a new index version went live (``index.gate`` held);
- ``ragpipe.index.held``: the gate kept a new version from readers (also each run
  that finds it still held);
- ``ragpipe.eval.gate-failed``: an ``eval compare`` regression gate failed.

The resource is the index: ``ragpipe.index.<12 hex of its identity>``, named by
the identity itself (an Edge store's path, or a qdrant URL and collection).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ragpipe.config import RagpipeConfig
from ragpipe.ingest.gatekeep import HELD, PROMOTED, STILL_HELD, Decision
from ragpipe.locking import index_identity, index_resource_id

# Under "ragpipe", the logger library_logs() connects to the run's logs (a module name,
# "flows.events", reached no handler: the emit's line never showed on a run's page).
logger = logging.getLogger("ragpipe.flows.events")

PROMOTED_EVENT = "ragpipe.index.promoted"
HELD_EVENT = "ragpipe.index.held"
EVAL_GATE_FAILED_EVENT = "ragpipe.eval.gate-failed"


def index_resource(config: RagpipeConfig) -> dict[str, str]:
    """The Prefect resource that stands for the configured index."""
    return {
        "prefect.resource.id": index_resource_id(config),
        "prefect.resource.name": index_identity(config),
        "ragpipe.store.backend": config.store.backend.value,
    }


def _emit(event: str, config: RagpipeConfig, payload: dict[str, Any]) -> None:
    from prefect.events import emit_event

    sent = emit_event(event=event, resource=index_resource(config), payload=payload)
    logger.info("emitted %s (%s)", event, "sent" if sent is not None else "events disabled")


def emit_index_decision(
    config: RagpipeConfig, decision: Decision, config_path: str | None = None
) -> None:
    """``ragpipe.index.promoted`` or ``ragpipe.index.held`` for the gate's decision (none
    for a version that stays off because a person discarded it or rolled back from it).

    ``config_path`` (the file the run read; "" for the default) goes in the payload, so
    that a triggered deployment (prefect.yaml) reads the same configuration."""
    verdict = decision.verdict
    payload = {
        "config_path": str(Path(config_path).resolve()) if config_path else "",
        "version": decision.generation,
        "live_before": decision.live_before,
        "outcome": decision.outcome,
        "summary": decision.line,
        "reasons": verdict.get("reasons", []),
        "metric": verdict.get("metric"),
        "golden": [
            {
                k: g.get(k)
                for k in (
                    "golden",
                    "items",
                    "staged",
                    "live",
                    "delta",
                    "delta_low",
                    "delta_high",
                    "passed",
                )
            }
            for g in verdict.get("golden", [])
        ],
        "reports_url": config.eval.reports_url
        or (f"{config.serve.public_url.rstrip('/')}/reports/" if config.serve.public_url else None),
    }
    if decision.outcome == PROMOTED:
        _emit(PROMOTED_EVENT, config, payload)
    elif decision.outcome in (HELD, STILL_HELD):  # not a version a person discarded
        _emit(HELD_EVENT, config, payload)


def default_index_resource_id() -> str:
    """The resource id of the index a run with no ``config_path`` writes: ragpipe.yaml in
    the working directory (else the defaults), with the ``RAGPIPE_*`` environment."""
    from ragpipe.config import load_config

    return index_resource_id(load_config(None))


def emit_eval_gate_failed(config: RagpipeConfig, failures: list[str], report: str) -> None:
    """``ragpipe.eval.gate-failed``: an eval-compare regression gate failed."""
    _emit(EVAL_GATE_FAILED_EVENT, config, {"failures": failures, "report": report})


if __name__ == "__main__":
    # `make prefect-deploy`: prefect.yaml's eval-retrieval trigger listens to this index only.
    print(default_index_resource_id())

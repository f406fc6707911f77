"""What ``GET /metrics`` exposes, in Prometheus text format (one registry per app)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# Seconds: a cached answer or a search is milliseconds, a generated answer seconds.
# The *_created series double the output and say only when the process started.
disable_created_metrics()  # type: ignore[no-untyped-call]

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServeMetrics:
    """Requests, latency, cache hits and the index being served."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ragpipe_requests",
            "HTTP requests answered, by endpoint and status code (499: a streamed response "
            "the client stopped reading).",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ragpipe_request_seconds",
            "Seconds from request to the last byte of the response handed to the server (its "
            "send to the client follows at the end of the event loop's turn), by endpoint.",
            ["endpoint"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.cache = Counter(
            "ragpipe_cache_lookups",
            "Semantic cache lookups, by endpoint and result (hit or miss).",
            ["endpoint", "result"],
            registry=self.registry,
        )
        self.cache_entries = Gauge(
            "ragpipe_cache_entries", "Entries in the semantic cache.", registry=self.registry
        )
        self.answers_cancelled = Counter(
            "ragpipe_answers_cancelled",
            "Answers whose generation stopped because their client went away.",
            registry=self.registry,
        )
        self.first_token = Histogram(
            "ragpipe_answer_first_token_seconds",
            "Seconds from the start of an answer to the model's first text (time to first "
            "token; the prompt's processing is most of it on CPU).",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.flagged = Counter(
            "ragpipe_answers_flagged",
            "Answers by flag (below_relevance_floor, invalid_citations_removed, uncited, "
            "degenerate, truncated, window_full, answer_withdrawn, not_found_dropped, "
            "misattributed_citation, no_answer_text); flagged answers are not cached.",
            ["flag"],
            registry=self.registry,
        )
        self.index_points = Gauge(
            "ragpipe_index_points", "Points in the index version served.", registry=self.registry
        )
        self.switches = Counter(
            "ragpipe_index_switches",
            "Switches to a newly published index version since start.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

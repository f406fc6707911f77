"""`ragpipe serve`: the real API on a loopback port over a real Edge index and real models.

Search (the CLI's JSON, XML and text), ask (JSON, server-sent events, NDJSON),
the semantic cache (hit, miss, emptied by a new version), limits (4xx with a
reason), the bearer token, CORS, metrics, and the switch to a newly published
version while requests are in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.routing import Route
from typer.testing import CliRunner

from flows.cli import app as cli
from ragpipe.config import RagpipeConfig
from ragpipe.errors import StageError
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.query.render import search_json
from ragpipe.query.retrieve import Retriever, split_fragments
from ragpipe.serve.app import create_app, request_models
from ragpipe.serve.cache import SemanticCache
from ragpipe.serve.index import LiveIndex
from ragpipe.serve.server import is_loopback, running
from ragpipe.store import published
from tests.support.loopback import free_port
from tests.support.paths import QUERY_CORPUS
from tests.support.readers import reader_copies

BREAD = "How long should bread bake?"


def _config(base: Path, **serve: Any) -> RagpipeConfig:
    return RagpipeConfig.model_validate(
        {
            "discover": {"roots": [str(base / "corpus")]},
            "chunk": {"size": 200, "overlap": 20},
            "embed": {"provider": "onnx"},
            "store": {"path": str(base / "store")},
            "paths": {"work_dir": str(base / "work")},
            "llm": {"max_tokens": 48},
            "serve": {"reload_seconds": 0.2, **serve},
        }
    )


def _index(base: Path, **serve: Any) -> RagpipeConfig:
    for name, text in QUERY_CORPUS.items():
        (base / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "corpus" / name).write_text(text, encoding="utf-8")
    cfg = _config(base, **serve)
    assert run_ingest(cfg).failed == 0
    return cfg


def _add_document(cfg: RagpipeConfig, name: str = "roses") -> str:
    """A new file, ingested and published; returns the new version."""
    root = Path(cfg.discover.roots[0])
    (root / "garden" / f"{name}.md").parent.mkdir(parents=True, exist_ok=True)
    (root / "garden" / f"{name}.md").write_text(
        f"# {name.title()}\n\nPrune {name} in late winter, just above an outward-facing bud.\n",
        encoding="utf-8",
    )
    assert run_ingest(cfg).failed == 0
    version = published.current(cfg.store.path)
    assert version is not None
    return version


def _wait_for_version(client: httpx.Client, version: str) -> None:
    deadline = time.monotonic() + 60
    while client.get("/healthz").json()["index"]["version"] != version:
        assert time.monotonic() < deadline, "the server did not switch to the new version"
        time.sleep(0.1)


def _events(response: httpx.Response, form: str) -> list[tuple[str, dict[str, Any]]]:
    if form == "ndjson":
        rows = [json.loads(line) for line in response.iter_lines() if line]
        return [(row.pop("event"), row) for row in rows]
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            assert name is not None
            events.append((name, json.loads(line[len("data: ") :])))
    return events


# -- the semantic cache on its own ---------------------------------------------------


def _v(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_cache_serves_only_close_questions_of_the_same_scope_and_version() -> None:
    cache = SemanticCache(threshold=0.95, max_entries=2)
    assert cache.get(_v(1, 0, 0), "ask", "v1") is None
    cache.put(_v(2, 0, 0), "ask", "v1", "first", "answer 1")  # normalised on the way in
    hit = cache.get(_v(1, 0.2, 0), "ask", "v1")  # cosine 0.981
    assert hit is not None and hit.value == "answer 1" and hit.query == "first"
    assert hit.similarity == pytest.approx(1 / np.sqrt(1.04), abs=1e-6)
    assert cache.get(_v(1, 0.4, 0), "ask", "v1") is None  # cosine 0.928: another question
    assert cache.get(_v(1, 0, 0), "search", "v1") is None  # another scope
    assert (cache.hits, cache.misses) == (1, 3)
    cache.put(_v(0, 1, 0), "ask", "v1", "second", "answer 2")
    cache.get(_v(1, 0, 0), "ask", "v1")  # "first" used last: "second" is the oldest now
    cache.put(_v(0, 0, 1), "ask", "v1", "third", "answer 3")
    assert len(cache) == 2 and cache.get(_v(0, 1, 0), "ask", "v1") is None
    assert cache.get(_v(1, 0, 0), "ask", "v2") is None and len(cache) == 0  # a new version
    cache.put(_v(1, 0, 0), "ask", "v1", "late", "computed on v1")  # finished after the switch
    assert len(cache) == 0


def test_an_exact_lookup_takes_only_the_same_question() -> None:
    cache = SemanticCache(threshold=0.95, max_entries=4)
    assert cache.get(_v(1, 0, 0), "ask", "v1", "a long question", exact=True) is None
    cache.put(_v(1, 0, 0), "ask", "v1", "a long question", "its answer")
    assert cache.get(_v(1, 0, 0), "ask", "v1", "another long one", exact=True) is None
    assert cache.get(_v(1, 0, 0), "ask", "v1", "another long one") is not None  # by vector
    # An entry stored from a question the embedder did not read whole: only its own text.
    cache.put(_v(0, 1, 0), "ask", "v1", "a log, then why", "the log's answer", whole=False)
    assert cache.get(_v(0, 1, 0), "ask", "v1", "a short question") is None
    held = cache.get(_v(0, 1, 0), "ask", "v1", "a log, then why")
    assert held is not None and held.value == "the log's answer"
    hit = cache.get(_v(1, 0, 0), "ask", "v1", "a long question", exact=True)
    assert hit is not None and hit.value == "its answer"


def test_a_cache_lookup_takes_the_closest_entry_the_question_guard_allows() -> None:
    cache = SemanticCache(threshold=0.9, max_entries=3)
    cache.clear("v")
    cache.put(_v(1, 0.3), "ask", "v", "How do I uninstall R 4.2?", "remove it")  # cosine 0.958
    cache.put(_v(1, 0.1), "ask", "v", "How do I install R 4.1?", "another version")  # 0.995
    cache.put(_v(1, 0.2), "ask", "v", "How do I install R 4.2?", "install it")  # 0.981
    # The closest conflicts (4.1), the next is taken; the guard runs in order of closeness.
    hit = cache.get(_v(1, 0), "ask", "v", "How can I install R 4.2?")
    assert hit is not None and hit.value == "install it"
    assert hit.similarity == pytest.approx(1 / np.sqrt(1.04), abs=1e-6)
    # Full: the least recently used ("uninstall") goes, and its row is reused.
    cache.put(_v(0, 1), "ask", "v", "What is CRAN?", "a network")
    assert len(cache) == 3
    assert cache.get(_v(1, 0.3), "ask", "v", "How do I uninstall R 4.2?") is None
    assert cache.get(_v(0.1, 1), "ask", "v", "What is CRAN?").value == "a network"  # type: ignore[union-attr]
    assert cache.get(_v(1, 0.1), "ask", "v", "How do I install R 4.1?").value == "another version"  # type: ignore[union-attr]
    # A vector of another size (another embedder) starts the cache again.
    cache.put(_v(1, 0, 0), "ask", "v", "q", "a")
    assert len(cache) == 1 and cache.get(_v(1, 0, 0), "ask", "v", "q").value == "a"  # type: ignore[union-attr]


def test_a_growing_cache_keeps_scopes_least_recent_ties_and_exact_repeats() -> None:
    rng = np.random.default_rng(7)
    cache = SemanticCache(threshold=0.99, max_entries=100)
    cache.clear("v")
    vectors = [rng.standard_normal(16).astype(np.float32) for _ in range(130)]
    for i, v in enumerate(vectors[:70]):  # past the first 64 rows: the matrix grows
        cache.put(v, "ask", "v", f"question {i}", i)
    assert len(cache) == 70
    assert all(cache.get(v, "ask", "v", f"question {i}").value == i  # type: ignore[union-attr]
               for i, v in enumerate(vectors[:70]))  # fmt: skip
    # A closer entry of another scope is not served; the one of this scope is.
    cache.put(vectors[0], "search", "v", "question 0", "other scope")
    assert cache.get(vectors[0] + 0.01, "ask", "v", "question 0").value == 0  # type: ignore[union-attr]
    # The same question cached twice: the one used least recently is served, as before.
    cache.put(vectors[1], "ask", "v", "question 1", "again")
    assert cache.get(vectors[1], "ask", "v", "question 1").value == 1  # type: ignore[union-attr]
    assert cache.get(vectors[1], "ask", "v", "question 1").value == "again"  # type: ignore[union-attr]
    # Past 100 the least recently used go; after a clear the rows are reused.
    for i, v in enumerate(vectors[70:], start=70):
        cache.put(v, "ask", "v", f"question {i}", i)
    assert len(cache) == 100 and cache.get(vectors[2], "ask", "v", "question 2") is None
    cache.clear("v2")
    assert len(cache) == 0 and cache.get(vectors[129], "ask", "v2", "question 129") is None
    cache.put(vectors[5], "ask", "v2", "question 5", "after the clear")
    assert cache.get(vectors[5], "ask", "v2", "question 5").value == "after the clear"  # type: ignore[union-attr]
    # At threshold 1.0 an exact repeat is a hit (float32 rounding aside), another is not.
    exact = SemanticCache(threshold=1.0, max_entries=4)
    exact.clear("v")
    for i, v in enumerate(vectors[:4]):
        exact.put(v * 3, "ask", "v", f"q{i}", i)
    assert [exact.get(v, "ask", "v", f"q{i}").value for i, v in enumerate(vectors[:4])] == [  # type: ignore[union-attr]
        0, 1, 2, 3,
    ]  # fmt: skip
    assert exact.get(vectors[0] + 0.05, "ask", "v", "q0") is None
    with pytest.raises(ValueError, match="max_entries must be at least 1"):
        SemanticCache(threshold=0.9, max_entries=0)


def test_cache_entries_expire_after_the_ttl() -> None:
    cache = SemanticCache(threshold=0.9, max_entries=8, ttl_seconds=0.05)
    cache.get(_v(1, 0), "ask", "v")
    cache.put(_v(1, 0), "ask", "v", "q", "a")
    assert cache.get(_v(1, 0), "ask", "v") is not None
    time.sleep(0.1)
    assert cache.get(_v(1, 0), "ask", "v") is None and len(cache) == 0


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")


# -- one server over an index nobody changes -----------------------------------------


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, onnx_embedder: Any, smollm: Any
) -> Iterator[tuple[RagpipeConfig, httpx.Client]]:
    cfg = _index(tmp_path_factory.mktemp("served"))
    with (
        running(create_app(cfg, onnx_embedder, smollm)) as url,
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        yield cfg, client


def test_healthz_reports_the_published_version(served: tuple[RagpipeConfig, Any]) -> None:
    cfg, client = served
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["embedder"] == "paraphrase-MiniLM-L3-v2"
    query = health["query_embedder"]
    assert (query["name"], query["runtime"], query["dim"]) == (
        "paraphrase-MiniLM-L3-v2", "onnxruntime", 384)  # fmt: skip
    assert query["warm_up_ms"] > 0 and query["warm_up_error"] is None  # searched at start
    assert health["index"]["version"] == published.current(cfg.store.path)
    with Retriever(cfg) as retriever:
        assert health["index"]["points"] == retriever.store.count() > 8
    assert health["index"]["files"] == len(QUERY_CORPUS)
    assert health["uptime_s"] > 0 and health["cache"]["threshold"] == 0.97
    assert client.get("/docs").status_code == 200
    head = client.head("/healthz")  # a load balancer's check (it was 405)
    assert head.status_code == 200 and head.content == b""
    assert {"/healthz", "/search", "/ask", "/metrics"} <= set(
        client.get("/openapi.json").json()["paths"]
    )


def test_the_warm_up_asks_no_llm(tmp_path: Path, onnx_embedder: Any) -> None:
    """With HyDE or the LLM filter on, the warm-up search ran the model at start (minutes
    on a CPU before the first request); it warms the embedder and the store only."""
    cfg = _index(tmp_path)
    llm_parts = {"hyde": "standard", "llm_filter": True}
    retrieve = type(cfg.retrieve).model_validate({**cfg.retrieve.model_dump(), **llm_parts})
    cfg = cfg.model_copy(update={"retrieve": retrieve})
    model = Replier("Bake the loaf.")
    app = create_app(cfg, onnx_embedder, model)
    with running(app) as url:
        health = httpx.get(f"{url}/healthz").json()
    assert health["query_embedder"]["warm_up_error"] is None and model.calls == 0


def test_search_returns_what_the_cli_prints(served: tuple[RagpipeConfig, Any]) -> None:
    cfg, client = served
    got = client.post("/search", json={"query": "How do I restore the database?", "k": 3})
    assert got.status_code == 200
    data = got.json()
    with Retriever(cfg) as retriever:
        expected = search_json(retriever.search("How do I restore the database?", top_k=3))
    assert [h["point_id"] for h in data["hits"]] == [h["point_id"] for h in expected["hits"]]
    assert [h["score"] for h in data["hits"]] == pytest.approx(
        [h["score"] for h in expected["hits"]]
    )
    assert data["hits"][0]["file_path"].endswith("backups.md")
    assert set(data["trace"]) == set(expected["trace"]) and data["trace"]["top_k"] == 3
    assert data["index_version"] == published.current(cfg.store.path)
    assert data["cache"] == {"hit": False}  # /search is not cached by default
    dense = client.post("/search", json={"query": "bread", "mode": "dense", "k": 2}).json()
    assert dense["trace"]["mode"] == "dense" and len(dense["hits"]) == 2
    only = {"query": "backup", "filters": {"file": "backups-copy.md"}, "format": "xml"}
    xml = client.post("/search", json=only)
    assert xml.headers["content-type"] == "application/xml"
    assert xml.text.startswith("<retrieved_context>") and "ops/backups.md" not in xml.text
    text = client.post("/search", json={"query": "bread", "format": "text", "k": 1})
    assert text.headers["content-type"].startswith("text/plain") and text.text.startswith("1. ")


def test_a_file_filter_is_described_as_it_matches(served: tuple[RagpipeConfig, Any]) -> None:
    """The API, the MCP tools, the CLI and the configuration said a file filter matched a
    path "ending in this": it matches whole trailing path parts, so .md and read.md matched
    nothing, silently."""
    from flows.cli_common import FilterOption
    from ragpipe.config import RetrieveConfig

    _, client = served

    def files(name: str) -> set[str]:
        got = client.post("/search", json={"query": BREAD, "k": 10, "filters": {"file": name}})
        assert got.status_code == 200, got.text
        return {h["file_path"].rsplit("/corpus/", 1)[1] for h in got.json()["hits"]}

    assert files("bread.md") == files("kitchen/bread.md") == {"kitchen/bread.md"}
    assert files("read.md") == files(".md") == files("hen/bread.md") == set()
    said = "ends with these whole path parts (a file name, or dir/name)"
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert said in schemas["Filters"]["properties"]["file"]["description"]
    listed = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={"Accept": "application/json, text/event-stream"})  # fmt: skip
    tools = listed.json()["result"]["tools"]
    assert [said in json.dumps(t["inputSchema"]["properties"]["file"]) for t in tools] == [
        True, True]  # fmt: skip
    description = RetrieveConfig.model_fields["filter_file"].description
    assert description is not None and said in description
    help_text = FilterOption.__metadata__[0].help
    assert "ends with these whole path parts: a file name, or dir/name" in help_text


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"query": "bread", "k": 51}, 422, "serve.max_k (50)"),
        ({"query": "x" * 2001}, 422, "serve.max_query_chars is 2000"),
        ({"query": "   "}, 422, "the query is empty"),
        ({"query": "bread", "mode": "fuzzy"}, 422, "'dense', 'sparse' or 'hybrid'"),
        ({"query": "bread", "k": 0}, 422, "greater than or equal to 1"),
        ({"query": "bread", "top_k": 3}, 422, "Extra inputs are not permitted"),
        ({"query": "bread", "filters": {"page": 3}}, 422, "Extra inputs are not permitted"),
        ({"query": "bread", "filters": {"file": " "}}, 422, "more than spaces"),
        ({"query": "bread", "filters": {"heading": ""}}, 422, "more than spaces"),
        ({"question": "bread"}, 422, "Field required"),
    ],
)
def test_requests_over_the_limits_get_4xx_with_a_reason(
    served: tuple[RagpipeConfig, Any], body: dict[str, Any], status: int, reason: str
) -> None:
    _, client = served
    got = client.post("/search", json=body)
    assert got.status_code == status and reason in got.text


def test_oversized_bodies_get_413_declared_or_chunked(served: tuple[RagpipeConfig, Any]) -> None:
    _, client = served
    big = json.dumps({"query": "bread " * 20_000}).encode()
    declared = client.post("/search", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and "serve.max_body_bytes" in declared.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server must count
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    chunked = client.post("/search", content=chunks(), headers={"content-type": "application/json"})
    assert chunked.status_code == 413
    assert client.post("/search", json={"query": "bread", "k": 1}).status_code == 200


def test_ask_answers_as_json_sse_and_ndjson(served: tuple[RagpipeConfig, Any]) -> None:
    cfg, client = served
    whole = client.post("/ask", json={"question": "Who wrote the first published program?"})
    assert whole.status_code == 200
    data = whole.json()
    assert data["sources"][0]["file_path"].endswith("computing.md")
    assert data["model"].startswith("SmolLM2") and data["tokens_out"] > 0
    assert data["index_version"] == published.current(cfg.store.path)
    for form in ("sse", "ndjson"):
        question = f"What happens in the Calvin cycle ({form})?"
        with client.stream("POST", "/ask", json={"question": question, "stream": form}) as got:
            assert got.status_code == 200
            expected = "text/event-stream" if form == "sse" else "application/x-ndjson"
            assert got.headers["content-type"].startswith(expected)
            events = _events(got, form)
        names = [name for name, _ in events]
        assert names[0] == "retrieval" and names[-1] == "answer" and "token" in names
        assert events[0][1]["hits"][0]["file_path"].endswith("photosynthesis.md")
        # The numbered sources come before the first token: [n] resolves while streaming
        # (the retrieval hits are by rank, which the sources' order need not follow).
        assert names.index("sources") < names.index("token")
        assert events[names.index("sources")][1]["sources"] == events[-1][1]["sources"]
        streamed = "".join(e["text"] for name, e in events if name == "token")
        assert streamed.strip() == events[-1][1]["answer"] != ""


class Replier:
    """A generator with one fixed reply, streamed word by word; counts its calls."""

    name = "replier"
    takes_grammar = False  # a scripted reply: nothing to constrain

    def __init__(self, text: str) -> None:
        self.text, self.calls = text, 0

    def chat(self, messages: Any, on_token: Any = None, **options: Any) -> Any:
        from ragpipe.models.llm import Completion

        self.calls += 1
        for word in self.text.split(" "):
            if on_token is not None:
                on_token(word + " ")
        return Completion(self.text, 10, len(self.text.split()), self.name, 0.01, "stop")

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_a_rephrased_question_is_served_from_the_cache(tmp_path: Path, onnx_embedder: Any) -> None:
    cfg = _index(tmp_path)
    # Source 1 for BREAD is bread.md's Dough section: the answer is its text (crediting it
    # with the Oven section's bake time is misattributed_citation, and is not cached).
    replier = Replier("Knead the dough for ten minutes [1].")
    with (
        running(create_app(cfg, onnx_embedder, replier)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        first = client.post("/ask", json={"question": BREAD}).json()
        assert first["cache"] == {"hit": False} and first["flags"] == []
        again = client.post("/ask", json={"question": "how long should bread bake"}).json()
        assert again["cache"]["hit"] is True and again["cache"]["cached_query"] == BREAD
        assert again["cache"]["similarity"] >= 0.97
        assert again["answer"] == first["answer"]
        assert again["question"] == "how long should bread bake"
        other = client.post("/ask", json={"question": "How long should the dough rise?"}).json()
        assert other["cache"] == {"hit": False}
        narrower = client.post("/ask", json={"question": BREAD, "k": 1}).json()  # another scope
        assert narrower["cache"] == {"hit": False}
        with client.stream("POST", "/ask", json={"question": BREAD, "stream": "sse"}) as got:
            events = _events(got, "sse")
        assert [n for n, _ in events] == ["retrieval", "sources", "token", "answer"]
        assert events[0][1]["cache"]["hit"] and events[-1][1]["answer"] == first["answer"]
        assert events[1][1]["sources"] == first["sources"]  # as numbered when it was made
        assert events[0][1]["hits"][0]["rank"] == 1  # the hits as a fresh answer lists them
        assert "_hits" not in events[-1][1]
        # No model ran for a hit: its time to first token is none, the cached answer's own
        # times are under cache.generated (a hit in 0.03 s said first_token_s 1.0).
        replayed = events[-1][1]
        assert replayed["first_token_s"] is None and replayed["tokens_out"] == 0
        assert replayed["cache"]["generated"]["tokens_out"] == first["tokens_out"] > 0
        assert replayed["replaces_stream"] is False
        assert replier.calls == 3  # first, other, narrower
        metrics = client.get("/metrics").text
        assert 'ragpipe_cache_lookups_total{endpoint="ask",result="hit"} 2.0' in metrics
        assert "ragpipe_answer_first_token_seconds_count 3.0" in metrics


def test_a_cached_search_answers_with_the_query_it_was_asked(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """A /search hit replied with the cached query's text in ``query``."""
    cfg = _index(tmp_path, cache_search=True)
    with (
        running(create_app(cfg, onnx_embedder)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        first = client.post("/search", json={"query": BREAD}).json()
        assert first["cache"] == {"hit": False} and first["query"] == BREAD
        again = client.post("/search", json={"query": "how long should bread bake"}).json()
        assert again["cache"]["hit"] is True and again["cache"]["cached_query"] == BREAD
        assert again["query"] == "how long should bread bake"
        assert again["hits"] == first["hits"]


def test_a_question_past_the_embedders_window_is_served_only_its_own_answer(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """A pasted log, then the question: past the embedder's 256 tokens two questions have
    one vector (cosine 1.0), and the cache gave the first one's answer to the second."""
    from ragpipe.models.embedders import reads_whole

    cfg = _index(tmp_path)
    line = "ERROR foo.service: connection refused by the upstream host; retrying. "
    log = line * 20
    fix, who = f"I get this log: {log} How do I fix it?", f"I get this log: {log} Who wrote Foo?"
    assert not reads_whole(onnx_embedder, fix) and reads_whole(onnx_embedder, BREAD)
    assert len(fix) < cfg.serve.max_query_chars  # a question serve takes
    replier = Replier("Restart the service [1].")
    with (
        running(create_app(cfg, onnx_embedder, replier)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        assert client.post("/ask", json={"question": fix}).json()["cache"] == {"hit": False}
        other = client.post("/ask", json={"question": who}).json()
        assert other["cache"] == {"hit": False} and replier.calls == 2
        again = client.post("/ask", json={"question": fix}).json()  # the same text: its own
        assert again["cache"]["hit"] is True and again["cache"]["cached_query"] == fix
        assert replier.calls == 2
        # A question that fits the window is not served the long one's answer either (the
        # stored vector stands for the log alone: cosine 0.990 here, over the threshold).
        short = f"I get this log: {line * 12} Who maintains foo.service?"
        assert reads_whole(onnx_embedder, short)
        cosine = float(onnx_embedder.embed_query(fix) @ onnx_embedder.embed_query(short))
        assert cosine >= cfg.serve.cache_threshold
        assert client.post("/ask", json={"question": short}).json()["cache"] == {"hit": False}
        assert replier.calls == 3


def test_reads_whole_counts_tokens_where_bytes_cannot_tell(onnx_embedder: Any) -> None:
    from ragpipe.models.embedders import TruncatedEmbedder, _Prefixed, reads_whole

    words = "bread " * 200  # 1,200 bytes, 200 word-pieces: read whole by the tokenizer
    assert reads_whole(onnx_embedder, words) and not reads_whole(onnx_embedder, words * 2)
    assert reads_whole(TruncatedEmbedder(onnx_embedder, 64), words)  # forwarded

    class Served:  # a server's embedder: no tokenizer here, so only the byte bound
        max_tokens, query_prefix, dim = 64, "search_query: ", 16

    assert reads_whole(Served(), "x" * 40)  # type: ignore[arg-type]
    assert not reads_whole(Served(), "x" * 50)  # type: ignore[arg-type]  # 14 + 50 + 4 > 64
    # A wrapper's prefix counts: the text the model reads is the prefixed one.
    assert not reads_whole(TruncatedEmbedder(Served(), 8), "x" * 50)  # type: ignore[arg-type]
    prefixed = _Prefixed(onnx_embedder, "", "Represent this sentence for searching: ")
    fits = "error code " * 125  # 252 word-pieces: whole alone, 258 with the prefix
    assert reads_whole(onnx_embedder, fits) and not reads_whole(prefixed, fits)


def test_a_flagged_answer_is_shown_with_its_flags_and_never_cached(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """Issue 32: the cache stored whatever the model wrote, loops and invented sources
    included, and served it to every later asker."""
    cfg = _index(tmp_path)
    replier = Replier("Bread bakes for a while [9].")  # cites a source it was not given
    with (
        running(create_app(cfg, onnx_embedder, replier)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        first = client.post("/ask", json={"question": BREAD}).json()
        assert first["answer"] == "Bread bakes for a while." and first["invalid_citations"] == [9]
        assert first["flags"] == ["invalid_citations_removed", "uncited"]
        again = client.post("/ask", json={"question": BREAD}).json()
        assert again["cache"] == {"hit": False} and replier.calls == 2
        metrics = client.get("/metrics").text
        assert 'ragpipe_answers_flagged_total{flag="uncited"} 2.0' in metrics
        # Streamed, the invented [9] reached the client before the check took it out: the
        # answer event says its text replaces what was streamed.
        with client.stream("POST", "/ask", json={"question": BREAD, "stream": "sse"}) as got:
            events = _events(got, "sse")
        streamed = "".join(e["text"] for name, e in events if name == "token")
        assert "[9]" in streamed and events[-1][1]["answer"] == "Bread bakes for a while."
        assert events[-1][1]["replaces_stream"] is True


def test_a_withdrawn_answer_is_not_cached(tmp_path: Path, onnx_embedder: Any) -> None:
    """An answer withdrawn as "not found" was cached and replayed with the first asker's
    withdrawn text; a flagged answer is never stored."""
    cfg = _index(tmp_path)
    replier = Replier("Bake the loaf for 35 minutes [1]. Not found in the provided documents.")
    with (
        running(create_app(cfg, onnx_embedder, replier)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        first = client.post("/ask", json={"question": BREAD}).json()
        assert first["flags"] == ["answer_withdrawn"]
        assert first["answer"] == "Not found in the provided documents."
        assert first["replaces_stream"] is True
        again = client.post("/ask", json={"question": BREAD}).json()
        assert again["cache"] == {"hit": False} and replier.calls == 2


def test_metrics_count_requests_and_time_them(served: tuple[RagpipeConfig, Any]) -> None:
    _, client = served
    before = client.get("/metrics").text
    client.post("/search", json={"query": "bread", "k": 1})
    client.post("/search", json={"query": "bread", "k": 99})
    after = client.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")

    def count(text: str, status: str) -> float:
        key = f'ragpipe_requests_total{{endpoint="/search",status="{status}"}} '
        line = next((li for li in text.splitlines() if li.startswith(key)), key + "0")
        return float(line.split()[-1])

    assert count(after.text, "200") == count(before, "200") + 1
    assert count(after.text, "422") == count(before, "422") + 1
    assert 'ragpipe_request_seconds_bucket{endpoint="/search",le="+Inf"}' in after.text
    assert 'status="500"' not in after.text


# -- token, CORS and a missing index -------------------------------------------------


def test_the_bearer_token_is_required_and_never_logged(
    served: tuple[RagpipeConfig, Any], onnx_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, _ = served
    secret = "s3cret-token-4711"
    locked = _config(Path(cfg.discover.roots[0]).parent, api_key=secret)
    caplog.set_level("DEBUG")
    with running(create_app(locked, onnx_embedder)) as url, httpx.Client(base_url=url) as client:
        body = {"query": "bread", "k": 1}
        missing = client.post("/search", json=body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert "serve.api_key" in missing.text
        wrong = client.post("/search", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = client.post("/search", json=body, headers={"Authorization": f"Bearer {secret}"})
        assert right.status_code == 200 and len(right.json()["hits"]) == 1
        assert client.get("/metrics").status_code == 401
        assert client.get("/healthz").status_code == 200  # liveness probes carry no token
    assert secret not in caplog.text


class Unready:
    """An embedder whose first query fails, as an embedding server not up yet."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.failed = inner, False

    def embed_query(self, text: str) -> Any:
        if not self.failed:
            self.failed = True
            raise OSError("cannot reach http://10.1.2.3:11434 from /srv/ragpipe")
        return self.inner.embed_query(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_the_open_healthz_tells_no_path_or_error_text_without_the_token(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """With a token set, /healthz (open for probes) showed anyone the store's path and the
    raw text of errors (paths, exception messages): now only with the token."""
    cfg = _index(tmp_path, api_key="h3alth")
    base = published.root(cfg.store.path)
    good = published.current(cfg.store.path)
    assert good is not None
    (base / "broken").mkdir()  # a version that cannot be opened
    token = {"Authorization": "Bearer h3alth"}
    with running(create_app(cfg, Unready(onnx_embedder))) as url:
        try:
            (base / published.CURRENT).write_text("broken", encoding="utf-8")
            deadline = time.monotonic() + 30
            while (full := httpx.get(f"{url}/healthz", headers=token).json())["index"][
                "last_reload_error"] is None:  # fmt: skip
                assert time.monotonic() < deadline, "the broken version was never tried"
                time.sleep(0.1)
            open_ = httpx.get(f"{url}/healthz").json()
            wrong = httpx.get(f"{url}/healthz", headers={"Authorization": "Bearer nope"}).json()
        finally:
            (base / published.CURRENT).write_text(good, encoding="utf-8")
    assert full["index"]["store"].startswith("edge:") and str(tmp_path) in full["index"]["store"]
    assert full["index"]["last_reload_error"].startswith("version broken: ")
    assert "10.1.2.3" in full["query_embedder"]["warm_up_error"]
    for seen in (open_, wrong):
        assert seen["status"] == "ok" and "store" not in seen["index"]
        assert seen["index"]["last_reload_error"] == "last reload failed; details with the token"
        assert seen["query_embedder"]["warm_up_error"] == (
            "the warm-up search failed; details with the token")  # fmt: skip
        assert str(tmp_path) not in json.dumps(seen) and "10.1.2.3" not in json.dumps(seen)
        # What a probe needs is all there: the version, the embedder, the counts.
        for section in ("index", "query_embedder", "cache"):
            kept = {k: v for k, v in full[section].items() if k in seen[section]}
            hidden = {"last_reload_error", "warm_up_error"}
            assert {k: v for k, v in seen[section].items() if k not in hidden} == {
                k: v for k, v in kept.items() if k not in hidden}, section  # fmt: skip
        assert seen["index"]["version"] == good and seen["index"]["points"] > 8
        assert seen["index"]["failed_version"] == "broken"
        assert seen["embedder"] == full["embedder"] == "paraphrase-MiniLM-L3-v2"


def test_search_and_mcp_read_the_authorization_header_by_one_rule(
    served: tuple[RagpipeConfig, Any], onnx_embedder: Any
) -> None:
    """/search (FastAPI's rule, on its fast path and its route) and /mcp let in and refuse
    the same Authorization headers: the first such header, read as Latin-1, the scheme in
    any case, the token stripped. /mcp read the last header and compared raw bytes, so a
    wrong first token and a right second one got into /mcp and not /search."""
    cfg, _ = served
    locked = create_app(_config(Path(cfg.discover.roots[0]).parent, api_key="k3y"),
                        onnx_embedder)  # fmt: skip
    let_in = [[b"Bearer k3y"], [b"bearer k3y"], [b"Bearer  k3y"], [b"Bearer k3y", b"Bearer no"]]
    refused = [[b"Bearer no", b"Bearer k3y"], [b"Basic k3y"], [b"Bearer"], [], [b"Bearer k3y\xe9"],
               [b"Bearer\tk3y"], [b"Bearer k3"]]  # fmt: skip
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = (b"accept", b"application/json, text/event-stream")
    with running(locked) as url, httpx.Client(base_url=url, timeout=60) as client:
        for sent in let_in + refused:
            headers = [(b"authorization", v) for v in sent]
            search = client.post("/search", json={"query": "bread", "k": 1}, headers=headers)
            mcp = client.post("/mcp", json=ping, headers=[*headers, accept])
            expected = 200 if sent in let_in else 401
            assert search.status_code == expected, (sent, search.text)
            assert (mcp.status_code == 401) is (expected == 401), (sent, mcp.status_code)
        assert locked.state.fast_search.served == len(let_in)


def test_cors_is_off_unless_origins_are_configured(
    served: tuple[RagpipeConfig, Any], onnx_embedder: Any
) -> None:
    cfg, client = served
    preflight = {"Origin": "https://chat.example.org", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in client.options("/search", headers=preflight).headers
    opened = _config(Path(cfg.discover.roots[0]).parent, cors_origins=["https://chat.example.org"])
    with running(create_app(opened, onnx_embedder)) as url, httpx.Client(base_url=url) as other:
        got = other.options("/search", headers=preflight)
        assert got.headers["access-control-allow-origin"] == "https://chat.example.org"
        evil = other.options("/search", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in evil.headers
        # A browser's MCP client: its preflight names the MCP headers (it was refused: 400).
        sent = "authorization, content-type, mcp-protocol-version, mcp-session-id, last-event-id"
        agent = other.options("/mcp", headers={**preflight, "Access-Control-Request-Headers": sent})
        assert agent.status_code == 200, agent.text
        assert agent.headers["access-control-allow-origin"] == "https://chat.example.org"
        allowed = agent.headers["access-control-allow-headers"].lower().split(", ")
        assert set(sent.split(", ")) <= set(allowed)
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        called = other.post("/mcp", json=ping, headers={
            "Origin": "https://chat.example.org", "Mcp-Protocol-Version": "2025-06-18",
            "Accept": "application/json, text/event-stream"})  # fmt: skip
        assert called.status_code == 200 and called.json()["result"] == {}
        assert called.headers["access-control-allow-origin"] == "https://chat.example.org"


def test_no_index_fails_at_start_with_what_to_run(tmp_path: Path, onnx_embedder: Any) -> None:
    with pytest.raises(StageError, match="ragpipe ingest"):
        create_app(_config(tmp_path), onnx_embedder)
    result = CliRunner().invoke(cli, ["serve", "--store-path", str(tmp_path / "none")])
    assert result.exit_code == 2 and "ragpipe ingest" in result.output


# -- new versions --------------------------------------------------------------------


def test_a_request_in_flight_keeps_its_version_across_a_switch(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    cfg = _index(tmp_path)
    index = LiveIndex(cfg, onnx_embedder)
    readers = published.root(cfg.store.path) / published.READERS
    try:
        with index.reader() as (retriever, version):  # a request that started before
            new = _add_document(cfg)
            assert new != version and index.refresh() and index.version == new
            hits = retriever.search("prune roses", top_k=3).hits  # still answers, on the old one
            assert hits and not any("roses" in h.file_path for h in hits)
            assert len(reader_copies(readers)) == 2  # the old copy is held, the new one open
        assert len(reader_copies(readers)) == 1  # the old copy went with its last request
        with index.reader() as (retriever, version):
            assert version == new
            assert retriever.search("prune roses", top_k=1).hits[0].file_path.endswith("roses.md")
        assert not index.refresh()  # nothing new
    finally:
        index.close()
    assert not readers.exists() or not list(readers.iterdir())


def test_a_search_embeds_all_its_sentences_before_it_waits_for_the_store(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """A query of several sentences is searched by each of them too: their embeddings were
    made under the store's lock, one request at a time, instead of side by side."""
    cfg = _index(tmp_path)
    service = create_app(cfg, onnx_embedder).state.service
    search_request, _ = request_models(cfg.serve)
    query = "How long should bread bake? Which roses need pruning in early spring?"
    fragments = split_fragments(query)
    assert len(fragments) == 2
    answers: list[Any] = []
    try:
        with service.index.holding() as held:
            embedded = held.retriever._query_vectors  # the retriever's query-vector cache
            with held.search:  # another request is searching the store
                worker = threading.Thread(
                    target=lambda: answers.append(
                        service.retrieved("search", query, search_request(query=query), {})
                    )
                )
                worker.start()
                deadline = time.monotonic() + 60
                while not all(f in embedded for f in [query, *fragments]):
                    assert time.monotonic() < deadline, sorted(embedded)
                    time.sleep(0.01)
                assert worker.is_alive()  # its texts embedded, it waits for the store
            worker.join(timeout=60)
        version, vector, _, hit, result = answers[0]
        assert version == service.index.version and hit is None and result is not None
        assert result.trace["fragments"] == fragments
        assert np.array_equal(vector, embedded[query]) and result.hits
    finally:
        service.worker.shutdown(wait=True)
        service.index.close()


class Judge:
    """A model that answers "yes" (with log-probabilities), each call held until ``release``
    is set; ``entered`` says a call began."""

    name = "judge"
    takes_grammar = False

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def chat(self, messages: Any, on_token: Any = None, **options: Any) -> Any:
        from ragpipe.models.llm import Completion

        self.calls += 1
        self.entered.set()
        assert self.release.wait(60), "never released"
        return Completion("yes", 10, 1, self.name, 0.0, "stop", {"yes": -0.1, "no": -2.4})

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_no_search_waits_for_the_llm_of_another(tmp_path: Path, onnx_embedder: Any) -> None:
    """A search held the store's lock through its LLM steps: with an LLM rerank of 1 s a
    call, a plain /search sent meanwhile took 9.7 s instead of 8 ms, and so did MCP's
    searches. The LLM works with the lock let go; here it works until the test says."""
    cfg = _index(tmp_path, cache=False)
    retrieve = cfg.retrieve.model_copy(update={"reranker": "llm"})
    cfg = cfg.model_copy(update={"retrieve": retrieve})
    judge = Judge()
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "rye flour", "k": 2}}}  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream"}
    reranked: list[httpx.Response] = []
    try:
        with running(create_app(cfg, onnx_embedder, judge)) as url:

            def rerank(query: str) -> threading.Thread:
                body = {"query": query, "rerank": True, "k": 2}
                worker = threading.Thread(target=lambda: reranked.append(
                    httpx.post(f"{url}/search", json=body, timeout=120)))  # fmt: skip
                worker.start()
                return worker

            workers = [rerank(BREAD)]
            assert judge.entered.wait(60)
            # A second one waits for the model: the two held both search threads.
            workers.append(rerank("Who wrote the first program?"))
            time.sleep(1)
            plain = httpx.post(f"{url}/search", json={"query": "rye flour", "k": 2}, timeout=10)
            assert plain.status_code == 200 and plain.json()["trace"]["reranker"] == "none"
            agent = httpx.post(f"{url}/mcp", json=ping, headers=accept, timeout=10)
            assert agent.status_code == 200 and not agent.json()["result"].get("isError")
            assert judge.calls == 1 and all(w.is_alive() for w in workers)  # still judging
            judge.release.set()
            for worker in workers:
                worker.join(timeout=60)
        assert [r.status_code for r in reranked] == [200, 200], [r.text for r in reranked]
        calls = [r.json()["trace"]["llm_rerank"]["model_calls"] for r in reranked]
        assert sum(calls) == judge.calls and min(calls) > 1
        assert all("rerank" in hit["scores"] for r in reranked for hit in r.json()["hits"])
    finally:
        judge.release.set()
    # HyDE's passages and the LLM filter: the same, on the index a server reads.
    for step in ({"hyde": "standard"}, {"llm_filter": True}):
        judge = Judge()
        stepped = RagpipeConfig.model_validate({**cfg.model_dump(), "retrieve": {
            **cfg.retrieve.model_dump(), **step}})  # fmt: skip
        index = LiveIndex(stepped, onnx_embedder, judge)
        found: list[Any] = []

        def search(index: LiveIndex, found: list[Any], **overrides: Any) -> None:
            with index.reader() as (retriever, _):
                found.append(retriever.search(BREAD, top_k=2, **overrides))

        try:
            slow = threading.Thread(target=search, args=(index, found))
            slow.start()
            assert judge.entered.wait(60)
            plain = threading.Thread(target=search, args=(index, found),
                                     kwargs={"hyde": "off", "llm_filter": False})  # fmt: skip
            plain.start()
            plain.join(timeout=10)
            assert not plain.is_alive() and len(found) == 1 and slow.is_alive(), step
            judge.release.set()
            slow.join(timeout=60)
            assert len(found) == 2 and found[1].hits, step
        finally:
            judge.release.set()
            index.close()


def test_a_failing_switch_hook_still_closes_the_old_version(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """The hook ran under the lock before the old copy was closed: when it raised, the old
    retriever (and its private copy of the index) was never closed."""
    cfg = _index(tmp_path)
    calls: list[tuple[str, int]] = []

    def hook(version: str, points: int) -> None:
        calls.append((version, points))
        raise RuntimeError("the hook failed")

    index = LiveIndex(cfg, onnx_embedder, on_switch=hook)
    readers = published.root(cfg.store.path) / published.READERS
    try:
        before = index.describe()["points"]
        new = _add_document(cfg)
        with pytest.raises(RuntimeError, match="the hook failed"):
            index.refresh()
        info = index.describe()
        assert info["version"] == new and info["switches"] == 1
        assert calls == [(new, info["points"])] and info["points"] > before
        assert len(reader_copies(readers)) == 1  # the old copy is gone, the new one open
        # From the poller: the version now served is not "failed", the error is shown.
        newer = _add_document(cfg, "tulips")
        index.poll_once(now=1.0)
        info = index.describe()
        assert info["version"] == newer and info["failed_version"] is None
        assert info["last_reload_error"] == f"version {newer}: after the switch: the hook failed"
        assert len(reader_copies(readers)) == 1
    finally:
        index.close()
    assert not readers.exists() or not list(readers.iterdir())


def test_the_server_switches_versions_under_load_and_empties_the_cache(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    cfg = _index(tmp_path)
    old = published.current(cfg.store.path)
    seen: list[tuple[int, str | None]] = []
    stop = threading.Event()
    replier = Replier("Knead the dough for ten minutes [1].")  # source 1's text, cited: cached
    with (
        running(create_app(cfg, onnx_embedder, replier)) as url,
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        assert client.post("/ask", json={"question": BREAD}).json()["cache"]["hit"] is False
        assert client.post("/ask", json={"question": BREAD}).json()["cache"]["hit"] is True

        def load() -> None:
            with httpx.Client(base_url=url, timeout=120) as own:
                while not stop.is_set():
                    got = own.post("/search", json={"query": "prune roses", "k": 1})
                    seen.append((got.status_code, got.json().get("index_version")))

        worker = threading.Thread(target=load)
        worker.start()
        try:
            new = _add_document(cfg)
            _wait_for_version(client, new)
            deadline = time.monotonic() + 30  # until a search has answered on the new version
            while not any(v == new for _, v in seen) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            worker.join()
        after = client.post("/ask", json={"question": BREAD}).json()
        assert after["cache"] == {"hit": False} and after["index_version"] == new
        health = client.get("/healthz").json()
        assert health["index"]["switches"] == 1 and health["index"]["files"] == 6
        assert "ragpipe_index_switches_total 1.0" in client.get("/metrics").text
    assert seen and all(status == 200 for status, _ in seen)
    versions = [v for _, v in seen]
    assert versions[0] == old and versions[-1] == new
    assert versions == sorted(versions, key=lambda v: v == new)  # never back to the old one


def test_a_broken_version_is_reported_and_not_copied_again_and_again(
    tmp_path: Path, onnx_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: /healthz showed an empty last_reload_error for a corrupt version, and the
    server copied the whole version again on every poll (every 2 s, for good)."""
    cfg = _index(tmp_path)
    base = published.root(cfg.store.path)
    good = published.current(cfg.store.path)
    assert good is not None
    shutil.copytree(base / good, base / "broken")
    for part in ("segments", "wal"):
        for path in (base / "broken" / part).rglob("*"):
            if path.is_file():
                path.write_bytes(b"\xff" * 100)
    index = LiveIndex(cfg, onnx_embedder)
    copies: list[Path] = []
    real_copy = published.reader_copy

    def counted(store_path: Path, version: str | None = None) -> Any:
        copies.append(store_path)
        return real_copy(store_path, version)

    monkeypatch.setattr(published, "reader_copy", counted)
    try:
        (base / published.CURRENT).write_text("broken", encoding="utf-8")
        index.poll_once(now=100.0)
        info = index.describe()
        assert info["version"] == good and info["failed_version"] == "broken"
        # Seen damaged before it is opened: its files are not the sizes it was published with.
        assert info["last_reload_error"].startswith("version broken: index version broken")
        assert "is damaged (files missing or cut short)" in info["last_reload_error"]
        assert len(copies) == 1
        for now, tries in ((100.5, 1), (101.1, 2), (102.9, 2), (103.2, 3), (106.0, 3)):
            index.poll_once(now=now)  # backoff 1 s, then 2 s, then 4 s
            assert len(copies) == tries, now
        served_copies = [p for p in reader_copies(base / published.READERS)
                         if p.name.startswith(f"{os.getpid()}-")]  # fmt: skip
        assert len(served_copies) == 1  # the good version's; each failed copy was removed

        def silent(store_path: Path, version: str | None = None) -> Any:
            raise RuntimeError()

        monkeypatch.setattr(published, "reader_copy", silent)
        (base / published.CURRENT).write_text("other", encoding="utf-8")
        index.poll_once(now=107.0)  # another version: tried at once
        assert index.describe()["last_reload_error"] == "version other: RuntimeError (no message)"
        (base / published.CURRENT).write_text(good, encoding="utf-8")  # back to the good one
        index.poll_once(now=108.0)
        info = index.describe()
        assert info["last_reload_error"] is None and info["failed_version"] is None
        assert info["version"] == good
    finally:
        index.close()


def test_serve_reads_a_qdrant_client_index(
    indexed_qdrant: RagpipeConfig, onnx_embedder: Any
) -> None:
    with (
        running(create_app(indexed_qdrant, onnx_embedder)) as url,
        httpx.Client(base_url=url) as client,
    ):
        health = client.get("/healthz").json()
        # An ungated Qdrant index: its point count and its last writing session's token.
        assert re.fullmatch(rf"points:{health['index']['points']}:[0-9a-f]{{12}}",
                            health["index"]["version"])  # fmt: skip
        got = client.post("/search", json={"query": "How do I restore the database?", "k": 1})
        assert got.json()["hits"][0]["file_path"].endswith("backups.md")


def _qdrant_corpus(tmp_path: Path, **sections: Any) -> RagpipeConfig:
    """The query corpus under tmp_path/corpus, indexed (by the caller) in qdrant-client's
    local mode with ``sections`` over the test config."""
    for name, text in QUERY_CORPUS.items():
        (tmp_path / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "corpus" / name).write_text(text, encoding="utf-8")
    base = _config(tmp_path)
    return base.model_validate({
        **base.model_dump(mode="json"),
        "store": {"backend": "qdrant", "path": str(tmp_path / "qdrant")},
        **sections,
    })  # fmt: skip


def test_serve_on_a_gated_qdrant_index_pins_each_request_and_follows_the_alias(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    from ragpipe.store import server_versions

    golden = tmp_path / "golden.yaml"
    item = "  - id: restore\n    query: How do I restore the database?\n"
    golden.write_text(f"name: g\nitems:\n{item}    relevance: {{ops/backups.md: 1}}\n",
                      encoding="utf-8")  # fmt: skip
    cfg = _qdrant_corpus(tmp_path, index={"gate": {"golden": [str(golden)], "max_drop": 0.5}},
                         eval={"granularity": "file", "resamples": 200})  # fmt: skip
    assert run_ingest(cfg).gate["outcome"] == "promoted"
    index = LiveIndex(cfg, onnx_embedder)
    try:
        with index.reader() as (retriever, version):  # a request that started before
            assert version == server_versions.current(cfg.store)
            (tmp_path / "corpus" / "garden").mkdir()
            (tmp_path / "corpus" / "garden" / "roses.md").write_text(
                "# Roses\n\nPrune roses in late winter, just above an outward-facing bud.\n",
                encoding="utf-8",
            )
            promoted = run_ingest(cfg).gate
            assert promoted["outcome"] == "promoted"
            assert index.refresh() and index.version == promoted["generation"] != version
            hits = retriever.search("prune roses", top_k=3).hits  # still its own version
            assert hits and not any("roses" in h.file_path for h in hits)
        with index.reader() as (retriever, version):
            assert version == promoted["generation"]
            assert retriever.index_version["generation"] == version
            assert retriever.search("prune roses", top_k=1).hits[0].file_path.endswith("roses.md")
        assert not index.refresh()  # nothing new
    finally:
        index.close()


def test_an_ungated_qdrant_index_rewritten_with_as_many_points_is_served_anew(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """A re-ingest that kept the point count (a renamed file, an edited chunk) was never
    seen by a running server on an ungated Qdrant index: its version was the count, so its
    file filter matched the old name, and its client BM25 returned text no longer stored."""
    cfg = _qdrant_corpus(tmp_path, retrieve={"sparse_engine": "rank_bm25"})
    points = run_ingest(cfg).points_total
    index = LiveIndex(cfg, onnx_embedder)
    try:
        with index.reader() as (retriever, _):
            assert retriever.search("oven", filter_file="bread.md").hits
            assert "230 degrees" in retriever.search("Celsius", mode="sparse").hits[0].text
        bread = tmp_path / "corpus" / "kitchen" / "bread.md"
        bread.with_name("loaf.md").write_text(
            bread.read_text(encoding="utf-8").replace("230 degrees", "250 degrees"),
            encoding="utf-8",
        )
        bread.unlink()
        assert run_ingest(cfg).points_total == points
        assert index.refresh()
        with index.reader() as (retriever, _):
            assert {h.file_path for h in retriever.search("oven", filter_file="loaf.md").hits}
            assert not retriever.search("oven", filter_file="bread.md").hits
            assert "250 degrees" in retriever.search("Celsius", mode="sparse").hits[0].text
        assert not index.refresh()  # nothing new
    finally:
        index.close()


def test_a_published_copy_is_removed_when_the_server_stops(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    cfg = _index(tmp_path)
    readers = published.root(cfg.store.path) / published.READERS
    with running(create_app(cfg, onnx_embedder)) as url:
        assert httpx.get(url + "/healthz").status_code == 200
        assert len(reader_copies(readers)) == 1
    assert not list(readers.iterdir())  # the copy and its owner's record


@contextlib.contextmanager
def _cli_server(args: list[str], **env: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`ragpipe serve ARGS` in a child process on a free loopback port, once it answers
    /healthz: (process, base URL). Stopped with SIGINT on exit unless it stopped already;
    the output is left in ``process.output``."""
    port = free_port()
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "ragpipe"), "serve", *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read().decode()  # type: ignore[union-attr]
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "ragpipe serve did not start"
                time.sleep(0.2)
        yield process, url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.output = process.communicate(timeout=60)[0].decode()  # type: ignore[attr-defined]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_cli_serves_until_interrupted_and_cleans_up(
    served: tuple[RagpipeConfig, Any], stop: signal.Signals
) -> None:
    cfg, _ = served
    readers = published.root(cfg.store.path) / published.READERS
    before = set(readers.iterdir())
    args = ["--store-path", str(cfg.store.path), "--embedder", "onnx"]
    with _cli_server(args, RAGPIPE_SERVE__API_KEY="cli-token") as (process, url):
        auth = {"Authorization": "Bearer cli-token"}
        got = httpx.post(f"{url}/search", json={"query": "bread"}, headers=auth)
        assert got.status_code == 200 and got.json()["hits"][0]["file_path"].endswith("bread.md")
        assert len(reader_copies(readers) - before) == 1  # its own copy of the version
        process.send_signal(stop)  # Ctrl-C, or `systemctl stop` / `timeout`
        started = time.monotonic()
        process.wait(timeout=60)
        assert time.monotonic() - started < 10
    output = process.output  # type: ignore[attr-defined]
    # uvicorn shuts down, then ends by the signal it caught (-15 for SIGTERM), as systemd expects
    assert process.returncode in (0, -stop), output
    assert "Uvicorn running on http://127.0.0.1:" in output and "cli-token" not in output
    assert "Traceback" not in output and "Application shutdown complete" in output
    assert set(readers.iterdir()) == before  # removed on the way out


def _schemathesis(url: str, workdir: Path, *extra: str) -> None:
    """Every schemathesis check against the running API; fails with its report."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "st"), "run", f"{url}/openapi.json",
         "--checks", "all", "--max-examples", "40", "--workers", "1", "--seed", "31",
         "--generation-database", "none", "--no-color",
         # The schema is under test, not latency: the first /ask loads the model and the
         # reranker, which took over schemathesis's default 10 s on a loaded CI machine.
         "--request-timeout", "120", "--max-response-time", "120",
         # The report files and trends: random names are 404s by design (schemathesis then
         # warns of missing test data); tests/test_serve_reports.py attacks those routes.
         "--exclude-path-regex", r"^/reports/.+", *extra],
        cwd=workdir, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout and " passed" in done.stdout


def test_the_openapi_document_tells_the_truth(
    tmp_path: Path, onnx_embedder: Any, tiny_cross_encoder: Path
) -> None:
    """Issue 31: schemathesis (every check, positive and negative data) against a real
    `ragpipe serve` with and without a key. Before: a required Authorization header the server
    did not require, 422 bodies off their schema, limits missing, /metrics declared JSON."""
    cfg = _index(tmp_path)
    config = tmp_path / "ragpipe.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "discover": {"roots": [str(tmp_path / "corpus")]},
                "chunk": {"size": 200, "overlap": 20},
                "embed": {"provider": "onnx"},
                "store": {"path": str(cfg.store.path)},
                "paths": {"work_dir": str(tmp_path / "work")},
                "llm": {"model": "smollm2-135m", "max_tokens": 24},
                "retrieve": {"reranker": str(tiny_cross_encoder)},  # rerank: true can run
            }
        ),
        encoding="utf-8",
    )
    with _cli_server(["-c", str(config)]) as (_, url):
        document = httpx.get(f"{url}/openapi.json").json()
        assert "securitySchemes" not in document.get("components", {})
        query = document["components"]["schemas"]["SearchRequest"]["properties"]["query"]
        assert (query["minLength"], query["maxLength"]) == (1, 2000)
        metrics = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
        assert list(metrics) == ["text/plain"]
        _schemathesis(url, tmp_path)
    with _cli_server(["-c", str(config)], RAGPIPE_SERVE__API_KEY="st-key") as (_, url):
        document = httpx.get(f"{url}/openapi.json").json()
        assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert document["paths"]["/search"]["post"]["security"] == [{"bearer": []}]
        assert "security" not in document["paths"]["/healthz"]["get"]
        _schemathesis(url, tmp_path, "--header", "Authorization: Bearer st-key")


# -- issue 31: answers nobody waits for ------------------------------------------------


def test_the_real_model_stops_when_its_reader_goes(smollm: Any) -> None:
    from ragpipe.models.llm import GenerationCancelled

    class Gone(GenerationCancelled):
        """The reader's own reason: the answer guard's looping stop is one (_Looping), and
        `eval rag` died when llama.cpp's callback turned it into a plain cancel."""

    seen: list[str] = []

    def reader(piece: str) -> None:
        seen.append(piece)
        if len(seen) == 3:
            raise Gone("gone")

    started = time.monotonic()
    with pytest.raises(Gone, match=r"^gone$"):  # the reader's own exception, as it was
        smollm.chat([{"role": "user", "content": "Tell a long story about a cat."}],
                    on_token=reader, max_tokens=400)  # fmt: skip
    assert len(seen) == 3 and time.monotonic() - started < 5


# 1,000 distinct words of three letters ("aaa", "baa", ..., "lmb"), none counting on: the
# Dripper's "word0 word1 ..." read to the repetition guard as one word counting on, a loop,
# and was stopped after about 40 pieces, so "it wrote under 200" held with no cancel at all.
DRIP = ["".join(chr(97 + i // 26**k % 26) for k in range(3)) for i in range(1000)]


class Dripper:
    """A generator that writes one distinct word every 20 ms, up to ``limit`` (1,000: 20 s
    of the model's time), and counts them."""

    name = "dripper"
    takes_grammar = False  # a scripted reply: nothing to constrain

    def __init__(self, limit: int = 1000) -> None:
        self.written = 0
        self.limit = limit
        self.finished = threading.Event()

    def chat(self, messages: Any, on_token: Any = None, **options: Any) -> Any:
        from ragpipe.models.llm import Completion

        words = DRIP[: self.limit]
        try:
            for word in words:  # a long answer, not a looping one
                time.sleep(0.02)
                self.written += 1
                if on_token is not None:
                    on_token(f"{word} ")
        finally:
            self.finished.set()
        return Completion("".join(f"{w} " for w in words), 10, len(words), self.name, 20.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_an_answer_stops_when_its_client_leaves_and_the_queue_is_bounded(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    from ragpipe.evaluation.answers import is_degenerate

    cfg = _index(tmp_path, max_queued_answers=0, cache=False)
    dripper = Dripper()
    with (
        running(create_app(cfg, onnx_embedder, dripper)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        body = {"question": "How long should bread bake?", "stream": "sse"}
        with client.stream("POST", "/ask", json=body) as got:
            lines = got.iter_lines()
            while "event: token" not in next(lines):
                pass
            # The model is busy with this answer: with no room to wait, another gets 429.
            busy = client.post("/ask", json={"question": "Who wrote the first program?"})
            assert busy.status_code == 429 and busy.headers["retry-after"] == "30"
            assert "too many answers waiting" in busy.json()["detail"]
        # The client left after its first tokens: the model stops within a token or two.
        assert dripper.finished.wait(10)
        assert dripper.written < 200  # before: all 1,000 (20 s of the model's time)
        assert not is_degenerate(" ".join(DRIP))  # no loop guard stopped it: the cancel did
        metrics = client.get("/metrics").text
        assert "ragpipe_answers_cancelled_total 1.0" in metrics
        # ... and the request is counted (it was in no status and no latency): 499.
        left = 'ragpipe_requests_total{endpoint="/ask",status="499"} 1.0'
        deadline = time.monotonic() + 10
        while left not in metrics and time.monotonic() < deadline:
            time.sleep(0.05)
            metrics = client.get("/metrics").text
        assert left in metrics
        # The slot is given back: the next question is answered in full (60 words, past
        # the 40 the loop guard starts at: the old Dripper's were cut there as a loop).
        dripper.finished.clear()
        dripper.limit, dripper.written = 60, 0
        whole = client.post("/ask", json={"question": "Who wrote the first program?"})
        assert whole.status_code == 200 and dripper.written == 60
        assert whole.json()["answer"] == " ".join(DRIP[:60])
        assert whole.json()["flags"] == ["uncited"]


def test_clients_gone_before_the_model_began_give_their_place_back(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """A streamed /ask whose client leaves at once, before the model's thread begins: its
    place in the queue comes back. It never did, so with one place three such clients made
    every /ask answer 429 until a restart."""
    cfg = _index(tmp_path, max_queued_answers=0, cache=False)
    replier = Replier("Bake bread for forty minutes [1].")
    with (
        running(create_app(cfg, onnx_embedder, replier)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        body = json.dumps({"question": "How long should bread bake?", "stream": "sse"}).encode()
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                conn.sendall(
                    b"POST /ask HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )  # and gone, before any event
        deadline = time.monotonic() + 30
        while True:
            got = client.post("/ask", json={"question": "How long should bread bake?"})
            if got.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # a departed client's place may still be held for a moment
        assert got.status_code == 200, got.text
        assert got.json()["answer"] == "Bake bread for forty minutes [1]."


class _FirstLong:
    """A generator whose first reply is 1,000 made-up words (no counting, no repeats: the
    loop guard lets it run) at 20 ms each, and every later one a short sentence; it keeps
    how many tokens each call wrote."""

    name = "first-long"
    takes_grammar = False  # a scripted reply: nothing to constrain

    def __init__(self) -> None:
        letters = np.random.default_rng(7).integers(0, 26, size=(1000, 8))
        self.words = ["".join(chr(97 + int(c)) for c in row) for row in letters]
        self.written: list[int] = []
        self.first_done = threading.Event()

    def chat(self, messages: Any, on_token: Any = None, **options: Any) -> Any:
        from ragpipe.models.llm import Completion

        first = not self.written
        words = self.words if first else ["Forty", "minutes", "[1]."]
        self.written.append(0)
        try:
            for word in words:
                time.sleep(0.02)
                self.written[-1] += 1
                if on_token is not None:
                    on_token(word + " ")
        finally:
            if first:
                self.first_done.set()
        return Completion(" ".join(words), 10, len(words), self.name, 0.02 * len(words))

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_a_whole_answer_stops_when_its_client_leaves(tmp_path: Path, onnx_embedder: Any) -> None:
    """/ask with stream none (the default) whose client gives up: the model stops at its
    next token, its place is given back, and the request counts as the client's leaving.
    Before, the model wrote all 1,000 tokens (20 s), every /ask meanwhile got 429, none was
    counted cancelled, and the request counted as a 200."""
    cfg = _index(tmp_path, max_queued_answers=0, cache=False)
    llm = _FirstLong()
    with (
        running(create_app(cfg, onnx_embedder, llm)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        with pytest.raises(httpx.ReadTimeout):  # the client waits 1 s and leaves
            httpx.post(url + "/ask", json={"question": "How long should bread bake?"}, timeout=1)
        left = time.monotonic()
        assert llm.first_done.wait(5) and time.monotonic() - left < 2
        assert 0 < llm.written[0] < 150  # 1 s of tokens and one more; not 1,000
        # The next question is admitted at once (it got 429 for the next 19 s), in full.
        got = client.post("/ask", json={"question": "Who wrote the first program?"})
        assert got.status_code == 200, got.text
        assert got.json()["answer"] == "Forty minutes [1]."
        assert time.monotonic() - left < 5
        metrics = client.get("/metrics").text
        assert "ragpipe_answers_cancelled_total 1.0" in metrics
        assert 'ragpipe_requests_total{endpoint="/ask",status="499"} 1.0' in metrics
        assert 'ragpipe_requests_total{endpoint="/ask",status="200"} 1.0' in metrics
        assert llm.written == [llm.written[0], 3]


def test_malformed_numbers_and_text_get_422_not_500(served: tuple[RagpipeConfig, Any]) -> None:
    _, client = served
    headers = {"content-type": "application/json"}
    for raw in (
        '{"query": "bread", "k": 1e400}',  # inf: FastAPI's echo of it was not JSON: 500
        '{"query": "bread", "k": NaN}',
        '{"query": "\\ud800 bread"}',  # a lone surrogate
        '{"query": "bread", "k": 99999999999999999999}',
    ):
        got = client.post("/search", content=raw, headers=headers)
        assert got.status_code == 422, (raw, got.status_code, got.text)
        detail = got.json()["detail"]
        assert detail and (isinstance(detail, str) or {"loc", "msg", "type"} <= set(detail[0]))
    # Said as what it is (it was "got a number with a fraction").
    for raw, read in (("1e400", "inf"), ("NaN", "nan"), ("-Infinity", "-inf")):
        got = client.post("/search", content=f'{{"query": "bread", "k": {raw}}}', headers=headers)
        assert got.status_code == 422 and [e["msg"] for e in got.json()["detail"]] == [
            f"Value error, Input should be a valid integer, got {read}: not a finite number"
        ]


# What POST /search may be sent: (body, content type, token); a list is sent in chunks. The
# fast path takes the first six as they are (the token-less one only with no token set) and
# the last one (with no token set, the wrong token's too); FastAPI's route answers the rest,
# each as it did before the fast path.
_FAST_TAKES: list[tuple[str | list[str], str | None, str]] = [
    ('{"query": "How long should bread bake?", "k": 2}', "application/json", "right"),
    ('{"query": "bread", "mode": "dense", "k": 1, "format": "text"}', "application/json", "right"),
    ('{"query": "backup", "format": "xml", "filters": {"file": "backups.md"}}', "Application/JSON",
     "right"),
    (['{"query": ', '"bread", "k": 1}'], "application/json", "right"),  # chunked
    ('{"query": "bread"}', "application/json", "lower-case scheme"),
    ('{"query": "bread"}', "application/json", "none"),  # no token set: taken; else 401
]  # fmt: skip
_FAST_PASSES_ON: list[tuple[str | list[str], str | None, str]] = [
    ('{"query": "\\ud800 bread"}', "application/json", "right"),  # a lone surrogate
    ('{"query": "bread", "k": 51}', "application/json", "right"),  # over serve.max_k
    ('{"query": "   "}', "application/json", "right"),
    ('{"query": "bread", "top_k": 3}', "application/json", "right"),
    ('{"query": "bread", "k": NaN}', "application/json", "right"),
    ('{"query": "bread"', "application/json", "right"),  # cut short
    ('["bread"]', "application/json", "right"),
    ("[" * 20_000 + "]" * 20_000, "application/json", "right"),  # deeper than json.loads goes
    ("", "application/json", "right"),
    ('{"query": "bread"}', "text/plain", "right"),
    ('{"query": "bread"}', None, "right"),
    ('{"query": "bread"}', "application/json; charset=utf-8", "right"),
    ('{"query": "bread"}', "application/json", "wrong"),
    ('{"query": "bread"}', "application/json", "padded"),
    ('{"query": "bread"}', "application/json", "non-ASCII"),
]


def _answer(got: httpx.Response) -> tuple[Any, ...]:
    """What a client gets, less what differs between two searches: the date, the trace's
    seconds (and so the length)."""
    body = re.sub(r'"seconds":[0-9.e+-]+', '"seconds":0', got.text)
    headers = sorted(
        (k, v) for k, v in got.headers.multi_items() if k not in ("date", "content-length")
    )
    assert int(got.headers.get("content-length", len(got.content))) == len(got.content)
    return got.status_code, headers, body


@pytest.mark.parametrize("key", [None, "s3cret-t0ken"], ids=["open", "token"])
def test_the_fast_search_path_answers_as_fastapi_does(
    served: tuple[RagpipeConfig, Any], onnx_embedder: Any, key: str | None
) -> None:
    """/search's fast path (FastSearch) against FastAPI's own route, request by request:
    the same status, headers and body for what the fast path takes and for what it passes on,
    with no token set and with one (a non-ASCII letter after it is refused both ways; a key
    with one, which only a client sending Latin-1 could match, is refused at load)."""
    cfg, _ = served
    config = _config(Path(cfg.discover.roots[0]).parent, api_key=key)
    app = create_app(config, onnx_embedder)
    fast = app.state.fast_search
    tokens = {"right": f"Bearer {key}", "wrong": "Bearer nope", "none": None,
              "lower-case scheme": f"bearer {key}", "padded": f"Bearer  {key}",
              "non-ASCII": f"Bearer {key}\u00e9"}  # fmt: skip
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:

        def send(body: str | list[str], content_type: str | None, token: str) -> httpx.Response:
            headers: dict[bytes, bytes] = {}
            if content_type:
                headers[b"content-type"] = content_type.encode()
            sent = tokens[token]
            if key is not None and sent is not None:
                headers[b"authorization"] = sent.encode("latin-1")  # as FastAPI reads
            if isinstance(body, list):
                return client.post(
                    "/search", content=iter(p.encode() for p in body), headers=headers
                )
            return client.post("/search", content=body.encode("utf-8"), headers=headers)

        cases = _FAST_TAKES + _FAST_PASSES_ON
        fast_answers = [send(*case) for case in cases]
        # open: all six, the wrong, padded and non-ASCII tokens' (none is sent); a token: the
        # five with it and the padded one
        taken = {None: 9, "s3cret-t0ken": 6}[key]
        assert (fast.served, fast.passed_on) == (taken, len(cases) - taken)
        app.dependency_overrides[time.time] = time.time  # any override at all
        overridden = [send(*case) for case in cases[:2]]
        assert (fast.served, fast.passed_on) == (taken, len(cases) - taken + 2)
        assert [_answer(got) for got in overridden] == [_answer(got) for got in fast_answers[:2]]
        app.dependency_overrides.clear()
        route = app.router.routes.pop(0)  # FastSearch: now FastAPI's route answers all
        fastapi_answers = [send(*case) for case in cases]
        assert (fast.served + fast.passed_on) == len(cases) + 2  # not called again
        assert isinstance(route, Route) and route.app is fast
    for case, mine, theirs in zip(cases, fast_answers, fastapi_answers, strict=True):
        assert _answer(mine) == _answer(theirs), case
    statuses = [got.status_code for got in fast_answers]
    assert statuses[:5] == [200] * 5 and fast_answers[1].text.startswith("1. ")
    opened = 200 if key is None else 401
    # the token-less request; the lone surrogate and six more 422s; json.loads's recursion
    # (400, as FastAPI says); no body, text/plain, no content type: not a JSON body (422);
    # the charset parameter (FastAPI reads it as JSON); a wrong token; the right one after
    # two spaces (FastAPI strips them); one letter more, not ASCII
    assert statuses[5:] == [opened] + [422] * 7 + [400] + [422] * 3 + [200, opened, 200, opened]


def test_an_error_the_search_raises_is_the_same_503_on_the_fast_path(
    served: tuple[RagpipeConfig, Any], onnx_embedder: Any
) -> None:
    """A search the fast path takes whose endpoint raises (rerank: true with a cross-encoder
    this server cannot load: a ConfigError) gets the 503 FastAPI's exception handler writes,
    as it does on FastAPI's own route; the review noted no test sent one."""
    cfg, _ = served
    base = Path(cfg.discover.roots[0]).parent
    missing = str(base / "no-such-cross-encoder")
    config = _config(base)
    config = config.model_copy(
        update={"retrieve": config.retrieve.model_copy(update={"reranker": missing})}
    )
    app = create_app(config, onnx_embedder)
    fast = app.state.fast_search
    body = '{"query": "How long should bread bake?", "rerank": true}'
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        headers = {"content-type": "application/json"}
        mine = client.post("/search", content=body, headers=headers)
        assert (fast.served, fast.passed_on) == (1, 0)
        route = app.router.routes.pop(0)  # FastSearch: now FastAPI's route answers
        theirs = client.post("/search", content=body, headers=headers)
        assert isinstance(route, Route) and route.app is fast and fast.served == 1
        plain = client.post("/search", content='{"query": "bread"}', headers=headers)
    assert mine.status_code == 503 and missing in mine.json()["detail"]
    assert _answer(mine) == _answer(theirs)
    assert plain.status_code == 200  # the server still searches


def _data_segments_in(conn: socket.socket) -> int | None:
    """Linux's count of TCP segments with data this socket has received (tcpi_data_segs_in,
    at byte 152 of struct tcp_info since Linux 4.6); None where the kernel has none."""
    info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("I", info, 152)[0]) if len(info) >= 156 else None


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's TCP_INFO")
def test_a_response_goes_out_in_one_send(served: tuple[RagpipeConfig, Any]) -> None:
    """Head and body in one write: uvicorn writes each ASGI message as it comes (two sends,
    two wakes of the client: about 0.2 ms a search on 2 cores)."""
    _, client = served
    host, port = str(client.base_url).removeprefix("http://").rstrip("/").split(":")
    body = b'{"query": "How long should bread bake?", "k": 1}'
    request = (
        b"POST /search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )

    def exchange(conn: socket.socket) -> bytes:
        conn.sendall(request)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < int(
            reply.lower().partition(b"content-length: ")[2].split(b"\r\n")[0] or 1 << 30
        ):
            got = conn.recv(65536)
            assert got, f"the server closed the connection: {reply[:200]!r}"
            reply += got
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        return reply

    with socket.create_connection((host, int(port)), timeout=30) as conn:
        exchange(conn)
        if not _data_segments_in(conn):  # an old kernel, or a sandbox that does not count
            pytest.skip("this kernel does not count TCP data segments")
        for _ in range(3):
            before = _data_segments_in(conn)
            reply = exchange(conn)
            assert len(reply) < 60_000  # under loopback's segment size: one write, one segment
            assert _data_segments_in(conn) - before == 1  # type: ignore[operator]


def test_a_client_gone_before_its_body_ends_gets_no_search(
    served: tuple[RagpipeConfig, Any],
) -> None:
    """A valid JSON start, then the client goes: FastAPI's 400 (counted), never a search
    answered to no one (the fast path took what had come, before it checked for the end)."""
    _, client = served

    def searches(status: str) -> float:
        key = f'ragpipe_requests_total{{endpoint="/search",status="{status}"}} '
        text = client.get("/metrics").text
        line = next((li for li in text.splitlines() if li.startswith(key)), key + "0")
        return float(line.split()[-1])

    before = {status: searches(status) for status in ("200", "400")}
    host, port = str(client.base_url).removeprefix("http://").rstrip("/").split(":")
    body = b'{"query": "How long should bread bake?"}'
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body) + 10}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.3)  # the server has what was sent; then the connection goes
    deadline = time.monotonic() + 30
    while searches("400") == before["400"]:
        assert time.monotonic() < deadline, "the cut request was never answered"
        time.sleep(0.1)
    assert searches("200") == before["200"]


def test_a_body_sent_a_byte_at_a_time_gets_408(tmp_path: Path, onnx_embedder: Any) -> None:
    cfg = _index(tmp_path, body_timeout_s=1.0)
    with running(create_app(cfg, onnx_embedder, Dripper())) as url:
        host, port = url.removeprefix("http://").split(":")
        body = b'{"query": "How long should bread bake?"}'
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(
                b"POST /search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
            )
            started = time.monotonic()
            reply = b""
            for byte in body:  # one byte every 0.5 s: 20 s in all, if let
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.5)
                conn.settimeout(0.01)
                with contextlib.suppress(TimeoutError, BlockingIOError):
                    reply += conn.recv(4096)
                if reply:
                    break
            conn.settimeout(5)
            if not reply:
                reply = conn.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"serve.body_timeout_s" in reply and time.monotonic() - started < 5


def test_the_cache_never_serves_a_question_that_means_something_else() -> None:
    from ragpipe.serve.cache import meaning_conflict

    cache = SemanticCache(threshold=0.97, max_entries=10)
    cache.clear("v1")
    asked = "Is it safe to grant the admin role to every user of the database?"
    cache.put(_v(1, 0), "scope", "v1", asked, "The answer is yes.")
    # Embeddings this close (the real pair scored 0.991): the cosine alone would serve it.
    near = _v(1, 0.1)
    for other, why in [
        ("Is it unsafe to grant the admin role to every user of the database?", "opposite"),
        ("Is it not safe to grant the admin role to every user of the database?", "negation"),
        ("Is it safe to grant the admin role to every user of database 7.2?", "number"),
        ('Is it safe to grant the "admin" role to every user of the database?', "quoted"),
    ]:
        assert cache.get(near, "scope", "v1", other) is None, other
        assert why in (meaning_conflict(asked, other) or "") or why in ("quoted", "number")
    same = "Please tell me: is it safe to grant the admin role to every user of the database?"
    hit = cache.get(near, "scope", "v1", same)
    assert hit is not None and hit.value == "The answer is yes."
    assert meaning_conflict("How do I enable it?", "How do I disable it?")
    assert meaning_conflict("How do I upgrade R?", "How do I downgrade R?")
    assert meaning_conflict("How do I install R?", "How do I reinstall R?") is None
    assert meaning_conflict("Can I do it?", "Can't I do it?") == "a negation differs"
    # Opposites with no shared stem: these pairs embed at 0.973, 0.971 and 0.985 with
    # all-MiniLM-L6-v2, over the 0.97 threshold, and were served each other's answer.
    for one, other in [
        ("How long should bread bake at high altitude?", "... at low altitude?"),
        ("What is the maximum backup retention?", "What is the minimum backup retention?"),
        ("Are files encrypted before upload?", "Are files encrypted after upload?"),
    ]:
        assert "mean the opposite" in (meaning_conflict(one, other) or ""), other
    assert meaning_conflict("How long should bread bake?", "How long must bread bake?") is None
    # The same words in another order: 0.97-0.998 with all-MiniLM-L6-v2, each served.
    for one, other in [
        ("How do I copy the backup from server A to server B?",
         "How do I copy the backup from server B to server A?"),
        ("Migrate from Python 2 to 3?", "Migrate from Python 3 to 2?"),
        ("Can the admin delete a user's files?", "Can a user delete the admin's files?"),
        # ... and with another word beside (the review: a hit at 0.992 and 0.991).
        ("How do I copy the backup from server A to server B?",
         "How can I copy the backup from server B to server A?"),
        ("How do I copy the backup from server A to server B?",
         "How do I copy the backup from server B over to server A?"),
        ("Migrate from Python 2 to 3?", "Migrating from Python 3 to 2?"),
    ]:  # fmt: skip
        assert meaning_conflict(one, other) == "the same words in another order", other
    assert meaning_conflict("How do I bake bread?", "how do I bake bread") is None
    assert meaning_conflict("How do I install R 4.2?", "How can I install R 4.2?") is None
    # A prefix repeating a word is no reordering (taking shared words in turn refused 65
    # of debfaq's and 35 of r-faq's meaning-keeping rewrites).
    assert meaning_conflict("How do I install R?", "I have a question. How do I install R?") is None
    # Rephrasings that move a part are no swap (the review: the LCS refused 7 of 8).
    for one, other in [
        ("How do I remove a package in R?", "In R, how can I remove a package?"),
        ("How can I change the font size in plots?",
         "How can I change the size of the font in plots?"),
        ("Why is my R session slow and how do I fix it?",
         "How do I fix my slow R session, and why is it slow?"),
    ]:  # fmt: skip
        assert meaning_conflict(one, other) is None, other


def test_a_question_the_model_window_cannot_hold_is_422(
    tmp_path: Path, onnx_embedder: Any, smollm: Any
) -> None:
    """llama.cpp refused the prompt inside the stream: an empty answer, 200 and cached.
    Then the budget was skipped in serve (its model wrapper hid the window), so every
    long question was a 503 "generation failed" naming llama.cpp."""
    from ragpipe.models.llm import LlamaCppLLM

    small = LlamaCppLLM("smollm2-135m", context_size=512, max_tokens=16)
    cfg = _index(tmp_path)
    with (
        running(create_app(cfg, onnx_embedder, small)) as url,
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        got = client.post("/ask", json={"question": "How long should bread bake? " * 60})
        assert got.status_code == 422, got.text
        (problem,) = got.json()["detail"]  # pydantic's shape, as every 422 here
        assert problem["loc"] == ["body", "question"] and "raise llm.context_size" in problem["msg"]
        fine = client.post("/ask", json={"question": "How long should bread bake?"})
        assert fine.status_code == 200 and 0 < fine.json()["tokens_in"] <= 512 - 16

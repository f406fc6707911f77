"""Queries without torch: the local embedder's verified ONNX export (issue 34)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError
from ragpipe.models import onnx_query
from ragpipe.models.embedders import LocalEmbedder, _packaged_minilm, make_embedder
from tests.support.paths import QUERY_CORPUS, REPO, SHARED

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DEBFAQ = SHARED / "debfaq" / "queries.jsonl"
HEAVY = ("torch", "transformers", "sentence_transformers", "docling", "prefect")


def _dev_queries() -> list[str]:
    import yaml

    golden = yaml.safe_load((REPO / "eval" / "golden" / "r-faq-dev.yaml").read_text("utf-8"))
    queries = [str(item["query"]) for item in golden["items"]]
    lines = DEBFAQ.read_text(encoding="utf-8").splitlines()
    return queries + [json.loads(line)["text"] for line in lines if line.strip()]


def test_the_onnx_query_embedder_is_the_torch_model_on_both_dev_sets(local_embedder: Any) -> None:
    queries = _dev_queries()
    assert len(queries) == 75 + 116
    onnx = make_embedder(RagpipeConfig().embed, query_side=True)
    assert isinstance(onnx, onnx_query.OnnxQueryEmbedder)
    assert onnx.name == local_embedder.name and onnx.dim == local_embedder.dim == 384
    cosines = np.sum(onnx.embed_documents(queries) * local_embedder.embed_documents(queries), 1)
    assert float(cosines.min()) >= onnx_query.MIN_COSINE
    long = " ".join(["apt pinning and release codenames"] * 80)  # past the 256-token window
    assert float(onnx.embed_query(long) @ local_embedder.embed_query(long)) >= 0.9999
    torch_config = RagpipeConfig(embed={"query_runtime": "torch"})  # type: ignore[arg-type]
    torch_side = make_embedder(torch_config.embed, query_side=True)  # still selectable
    assert isinstance(torch_side, LocalEmbedder)


def test_prefixes_and_truncation_apply_on_top_of_the_onnx_embedder(local_embedder: Any) -> None:
    settings = {"dimensions": 128, "query_prefix": "query: "}
    onnx = make_embedder(RagpipeConfig(embed=settings).embed, query_side=True)  # type: ignore[arg-type]
    torch = make_embedder(RagpipeConfig(embed={**settings, "query_runtime": "torch"}).embed,  # type: ignore[arg-type]
                          query_side=True)  # fmt: skip
    assert onnx.name == torch.name == "all-MiniLM-L6-v2@128" and onnx.dim == 128
    question = "How do I restore the database?"
    assert float(onnx.embed_query(question) @ torch.embed_query(question)) >= 0.9999


def test_a_model_the_onnx_path_would_not_reproduce_is_refused_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAGPIPE_MODEL_CACHE", str(tmp_path / "cache"))
    source, model = _packaged_minilm(), tmp_path / "with-dense"
    for name in ("config.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_bytes((source / name).read_bytes())
    modules = json.loads((source / "modules.json").read_text(encoding="utf-8"))
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                       "type": "sentence_transformers.models.Dense"})  # fmt: skip
    (model / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    config = RagpipeConfig(embed={"model": str(model)}).embed  # type: ignore[arg-type]
    assert onnx_query.onnx_for_queries(config) is None  # refused before any export
    assert "the ONNX query path runs Transformer, mean Pooling and Normalize only" in caplog.text
    graph, verdict = onnx_query.verified_graph(model)
    assert graph is None and verdict is not None and "Dense" in verdict["error"]


def test_a_refused_export_keeps_the_torch_path_or_stops_when_onnx_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAGPIPE_MODEL_CACHE", str(tmp_path))
    target = onnx_query.graph_dir(_packaged_minilm())
    target.mkdir(parents=True)
    verdict = {"passed": False, "min_cosine": 0.97, "queries": 85}
    (target / onnx_query.VERDICT).write_text(json.dumps(verdict), encoding="utf-8")
    auto = RagpipeConfig().embed
    assert onnx_query.onnx_for_queries(auto) is None
    assert (f"queries use torch: its ONNX export was refused (min cosine 0.97; remove {target} "
            "to export and verify it again)") in caplog.text  # fmt: skip
    # Removing the folder, as the message says, exports and verifies afresh.
    shutil.rmtree(target)
    assert isinstance(onnx_query.onnx_for_queries(auto), onnx_query.OnnxQueryEmbedder)
    # A copied cache: the graph's mtime is not the one verified. It was refused for good
    # (torch from then on, until the folder was removed); it is verified again.
    graph = target / onnx_query.GRAPH
    os.utime(graph, ns=(graph.stat().st_atime_ns, graph.stat().st_mtime_ns + 10**9))
    assert onnx_query.verified_graph(_packaged_minilm())[0] is None
    assert isinstance(onnx_query.onnx_for_queries(auto), onnx_query.OnnxQueryEmbedder)
    assert onnx_query.verified_graph(_packaged_minilm())[0] == graph
    (target / onnx_query.VERDICT).write_text(json.dumps(verdict), encoding="utf-8")
    strict = RagpipeConfig(embed={"query_runtime": "onnx"}).embed  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"query_runtime onnx: its ONNX export was refused"):
        onnx_query.onnx_for_queries(strict)


_PROBE = """
import atexit, sys
atexit.register(lambda: sys.stderr.write(
    "HEAVY=" + ",".join(m for m in {heavy!r} if m in sys.modules) + "\\n"))
from flows.cli import app
sys.argv = ["ragpipe", *sys.argv[1:]]
app()
"""


def _heavy_modules(args: list[str]) -> tuple[list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    line = [x for x in done.stderr.splitlines() if x.startswith("HEAVY=")][-1]
    return [m for m in line[len("HEAVY=") :].split(",") if m], done.stdout


def test_search_and_eval_load_no_torch_transformers_docling_or_prefect(tmp_path: Path) -> None:
    from ragpipe.ingest.pipeline import run_ingest

    for name, text in QUERY_CORPUS.items():
        (tmp_path / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "corpus" / name).write_text(text, encoding="utf-8")
    config = {"discover": {"roots": [str(tmp_path / "corpus")]},
              "store": {"path": str(tmp_path / "store")},
              "paths": {"work_dir": str(tmp_path / "work")}}  # fmt: skip
    run_ingest(RagpipeConfig.model_validate(config))  # the default local embedder
    assert onnx_query.onnx_for_queries(RagpipeConfig().embed) is not None  # exported
    config_file = tmp_path / "ragpipe.yaml"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    heavy, out = _heavy_modules(["search", "How do I restore the database?", "--format",
                                 "json", "--config", str(config_file)])  # fmt: skip
    assert heavy == []
    assert json.loads(out)["hits"][0]["file_path"].endswith("backups.md")
    # `eval retrieval` runs in-process without Prefect unless --flow (tests/test_evaluate.py)
    golden = tmp_path / "golden.yaml"
    golden.write_text(json.dumps({"name": "two", "items": [
        {"id": "db", "query": "How do I restore the database?",
         "relevance": {"backups.md": 1}},
        {"id": "ada", "query": "Who wrote the first program for Babbage's Analytical Engine?",
         "relevance": {"computing.md": 1}},
    ]}), encoding="utf-8")  # fmt: skip
    heavy, out = _heavy_modules(["eval", "retrieval", "--config", str(config_file), "--golden",
                                 str(golden), "--granularity", "file", "--reports-dir",
                                 str(tmp_path / "reports")])  # fmt: skip
    assert heavy == []
    # `ragpipe inspect` reads the index the same way
    heavy, out = _heavy_modules(["inspect", "stats", "--format", "json", "--config",
                                 str(config_file)])  # fmt: skip
    assert heavy == []
    assert json.loads(out)["files"] == len(QUERY_CORPUS)
    (summary,) = (tmp_path / "reports").glob("*-two/summary.json")
    metrics = json.loads(summary.read_text(encoding="utf-8"))["metrics"]["default"]
    # both targets first: reciprocal ranks 1 and 1
    assert (metrics["mrr"]["mean"], metrics["mrr"]["n"]) == (1.0, 2)
    # `ragpipe serve`: warmed up on the ONNX graph, and still nothing heavy after a search
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), "serve", "--config",
         str(config_file), "--port", str(port)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            assert server.poll() is None, server.communicate()[1]
            try:
                health = httpx.get(f"{url}/healthz").json()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        query = health["query_embedder"]
        assert (query["name"], query["runtime"]) == ("all-MiniLM-L6-v2", "onnxruntime")
        assert query["warm_up_ms"] > 0 and query["warm_up_error"] is None
        found = httpx.post(f"{url}/search", json={"query": "How do I restore the database?"})
        assert found.json()["hits"][0]["file_path"].endswith("backups.md")
    finally:
        server.send_signal(signal.SIGINT)
        errors = server.communicate(timeout=60)[1]
    line = [x for x in errors.splitlines() if x.startswith("HEAVY=")][-1]
    assert line == "HEAVY=", errors[-3000:]

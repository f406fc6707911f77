"""Reports a team can open: `ragpipe serve` serves eval.reports_dir read-only at /reports/
(issue 33), behind the same token, and never a file outside it."""

from __future__ import annotations

import http.client
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.evaluation.report import report_link
from ragpipe.evaluation.run import run_retrieval
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.serve.app import create_app
from ragpipe.serve.server import running
from tests.support.paths import QUERY_CORPUS

pytestmark = pytest.mark.integration

GOLDEN = """
name: serve-check
items:
  - id: oven
    query: How hot should the oven be for bread?
    relevance: {bread.md: 3}
  - id: restore
    query: How do I restore the database from a backup?
    relevance: {ops/backups.md: 3}
"""
TOKEN = "s3cret-reports-token"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, onnx_embedder: Any
) -> Iterator[tuple[RagpipeConfig, httpx.Client, str]]:
    base = tmp_path_factory.mktemp("reports")
    for name, text in QUERY_CORPUS.items():
        (base / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "corpus" / name).write_text(text, encoding="utf-8")
    (base / "golden.yaml").write_text(GOLDEN, encoding="utf-8")
    (base / "secret.txt").write_text("outside the reports", encoding="utf-8")
    cfg = RagpipeConfig.model_validate({
        "discover": {"roots": [str(base / "corpus")]},
        "embed": {"provider": "onnx"},
        "store": {"path": str(base / "store")},
        "paths": {"work_dir": str(base / "work")},
        "eval": {"golden": str(base / "golden.yaml"), "reports_dir": str(base / "reports"),
                 "granularity": "file", "resamples": 200},
        "serve": {"api_key": TOKEN, "public_url": "http://ragpipe.example:8080"},
    })  # fmt: skip
    assert run_ingest(cfg).failed == 0
    _, summary = run_retrieval(cfg)
    (base / "reports" / "out").symlink_to(base / "secret.txt")  # a link out of the folder
    with (
        running(create_app(cfg, onnx_embedder)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield cfg, client, summary.run_id


def test_the_index_lists_each_run_linked_to_its_report(served: Any) -> None:
    cfg, client, run_id = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    page = client.get("/reports/", headers=auth)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f"href='{run_id}/report.html'" in page.text and "serve-check" in page.text
    assert "href='trend/serve-check'" in page.text
    report = client.get(f"/reports/{run_id}/report.html", headers=auth)
    assert report.status_code == 200
    on_disk = (cfg.eval.reports_dir / run_id / "report.html").read_bytes()
    assert report.content == on_disk  # served as written
    trend = client.get("/reports/trend/serve-check", headers=auth)
    assert trend.status_code == 200 and "<svg" in trend.text
    assert client.get("/reports/trend/nothing", headers=auth).status_code == 404
    # The Prefect link artifact points there (serve.public_url, no eval.reports_url).
    link = report_link(cfg, cfg.eval.reports_dir / run_id)
    assert link == f"http://ragpipe.example:8080/reports/{run_id}/report.html"


def test_nothing_outside_the_reports_folder_is_served(served: Any) -> None:
    cfg, client, run_id = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    secret = os.fspath(cfg.eval.reports_dir.parent / "secret.txt")
    for path in ("/reports/../secret.txt", "/reports/%2e%2e/secret.txt",
                 "/reports/..%2Fsecret.txt", f"/reports/{secret}", "/reports//etc/passwd",
                 "/reports/out", f"/reports/{run_id}/../../secret.txt"):  # fmt: skip
        response = client.get(path, headers=auth)
        assert response.status_code == 404, path
        assert b"outside the reports" not in response.content, path
    assert client.get("/reports/nothing.html", headers=auth).status_code == 404
    # A name too long for the file system: 404 as JSON, as the OpenAPI document says (500).
    long = client.get("/reports/" + "a" * 300, headers=auth)
    assert long.status_code == 404 and "detail" in long.json()
    # httpx normalises "/a/../b" before sending: send the raw paths as a client may.
    host, port = str(client.base_url.host), int(client.base_url.port or 80)
    for raw in ("/reports/../secret.txt", f"/reports/{run_id}/../../secret.txt",
                "/reports/./../secret.txt", "/reports/%2e%2e/secret.txt"):  # fmt: skip
        connection = http.client.HTTPConnection(host, port, timeout=30)
        try:
            connection.request("GET", raw, headers=auth)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        assert response.status == 404, raw
        assert b"outside the reports" not in body, raw
    head = client.head(f"/reports/{run_id}/report.html", headers=auth)
    assert head.status_code == 200 and int(head.headers["content-length"]) > 0


def test_reports_need_the_token(served: Any) -> None:
    _, client, run_id = served
    for path in ("/reports/", f"/reports/{run_id}/report.html", "/reports/trend/serve-check"):
        assert client.get(path).status_code == 401, path
        wrong = client.get(path, headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401, path


def test_an_absolute_path_is_never_joined_outside(tmp_path: Path) -> None:
    from ragpipe.serve.reports import inside

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "a.html").write_text("a", encoding="utf-8")
    (tmp_path / "x.txt").write_text("x", encoding="utf-8")
    assert inside(tmp_path / "r", "a.html") == (tmp_path / "r" / "a.html").resolve()
    assert inside(tmp_path / "r", "/a.html") == (tmp_path / "r" / "a.html").resolve()
    assert inside(tmp_path / "r", str(tmp_path / "x.txt")) is None
    assert inside(tmp_path / "r", "../x.txt") is None
    assert inside(tmp_path / "r", "") is None  # the folder itself is no file
    assert inside(tmp_path / "r", "a.html\x00") is None
    assert inside(tmp_path / "r", "a" * 300) is None  # ENAMETOOLONG


def test_the_index_heads_every_kind_of_run_with_real_metric_names(tmp_path: Path) -> None:
    # The index headed RAG runs by "answer_correctness_f1", a metric no run writes: a RAG
    # run's row showed no number at all.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragpipe.evaluation.metrics import METRICS
    from ragpipe.evaluation.rag import ALL_RAG_METRICS
    from ragpipe.evaluation.run import HISTORY_SCHEMA
    from ragpipe.serve.reports import HEADLINE, index_page

    assert set(HEADLINE) <= {*METRICS, *ALL_RAG_METRICS}
    row = {"run_id": "20261101T000000Z-faq-rag", "finished_at": "2026-11-01", "name": "faq-rag",
           "golden": "faq", "granularity": "answer", "variant": "rag", "kind": "rag",
           "queries": 20, "scope": "the first 20 of 75 items (--limit), top_k 5", "n": 20,
           "git_revision": ""}  # fmt: skip
    rows = [{**row, "metric": "answer_f1", "mean": 0.4321, "ci_low": 0.3, "ci_high": 0.55},
            {**row, "metric": "citation_precision", "mean": 0.8765, "ci_low": 0.8,
             "ci_high": 0.95}]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA), tmp_path / "history.parquet")
    page = index_page(tmp_path)
    assert "<th>answer_f1</th><th>citation_precision</th></tr>" in page
    scope = "the first 20 of 75 items (--limit), top_k 5"
    assert (f"<td>{scope}</td><td><span>0.432 [0.300, 0.550] (n=20)</span></td>"
            "<td><span>0.876 [0.800, 0.950] (n=20)</span></td>") in page  # fmt: skip


def test_a_damaged_history_is_503_naming_it(tmp_path: Path) -> None:
    """Read as a ConfigError now (ragpipe report's own message), which _readable let out as
    a 500."""
    from fastapi import HTTPException

    from ragpipe.serve.app import _readable
    from ragpipe.serve.reports import index_page

    (tmp_path / "history.parquet").write_bytes(b"garbage")
    with pytest.raises(HTTPException) as err:
        _readable(index_page, tmp_path)
    assert err.value.status_code == 503
    assert "history.parquet is not a ragpipe history file" in str(err.value.detail)

"""Dependencies that go away: the Qdrant server and the Ollama server, down from
the start, timing out, or dying mid-run.

A Qdrant-API loopback server backed by qdrant-client's real engine stands in
for the Qdrant server (there is no server binary here); the Ollama one is backed
by a real ONNX model. Every case ends with: a clear error, bounded retries,
nothing marked done that was not written, and a next run that completes and
equals a clean run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.errors import StageError
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.models.embedders import OnnxEmbedder
from tests.support.corpora import topic_doc, write_topics
from tests.support.ollama_server import ollama_server
from tests.support.qdrant_server import QdrantFake, closed_port_url, qdrant_server

pytestmark = pytest.mark.integration


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_topics(tmp_path / "corpus", 4)


def server_config(corpus: Path, work: Path, url: str, **store: Any) -> RagpipeConfig:
    return RagpipeConfig(
        discover={"roots": [corpus]},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"backend": "qdrant", "url": url, "api_key": "k3y", "timeout_s": 1,  # type: ignore[arg-type]
               "batch_size": 8, "retries": 2, **store},
        paths={"work_dir": work},  # type: ignore[arg-type]
    )  # fmt: skip


def ollama_config(corpus: Path, base: Path, host: str, **embed: Any) -> RagpipeConfig:
    """An Edge index embedded by the loopback Ollama server, one retry per request."""
    return RagpipeConfig(
        discover={"roots": [corpus]},  # type: ignore[arg-type]
        embed={"provider": "ollama", "model": "all-minilm", "ollama_host": host,  # type: ignore[arg-type]
               "retries": 1, **embed},
        store={"path": base / "store"},  # type: ignore[arg-type]
        paths={"work_dir": base / "work"},  # type: ignore[arg-type]
    )  # fmt: skip


def point_ids(fake: QdrantFake) -> set[str]:
    records, _ = fake.engine.scroll("ragpipe", limit=10_000)
    return {str(r.id) for r in records}


def manifest(cfg: RagpipeConfig, stage: str) -> checkpoint.Manifest | None:
    return checkpoint.read_manifest(cfg.paths.work_dir / stage)


def test_qdrant_server_down_fails_before_any_conversion(corpus: Path, tmp_path: Path) -> None:
    cfg = server_config(corpus, tmp_path / "work", closed_port_url())
    started = time.monotonic()
    with pytest.raises(StageError) as err:
        run_ingest(cfg)
    message = str(err.value)
    assert "failed get_aliases after 3 attempt(s)" in message  # the first call: its alias
    assert "store.url" in message and cfg.store.url in message  # type: ignore[operator]
    assert time.monotonic() - started < 10  # 0.5 + 1 s of backoff, no hanging
    assert not (tmp_path / "work" / "convert").exists()
    assert manifest(cfg, "plan") is None


@pytest.mark.slow
def test_qdrant_dying_mid_upsert_then_the_next_run_completes(corpus: Path, tmp_path: Path) -> None:
    with qdrant_server(api_key="k3y") as fake:
        cfg = server_config(corpus, tmp_path / "work", fake.url)
        fake.fail("refuse", on="PUT /collections/ragpipe/points")  # down from the first write
        with pytest.raises(StageError, match="failed upsert after 3 attempt"):
            run_ingest(cfg)
        assert fake.calls["PUT /collections/ragpipe/points"] == 3  # bounded: 1 + 2 retries
        assert manifest(cfg, "embed") is not None  # the vectors are kept ...
        assert manifest(cfg, "upsert") is None  # ... but nothing claims they are stored
        assert not (tmp_path / "work" / "summary.json").exists()

        fake.fail(None)  # the server is back
        summary = run_ingest(cfg)
        assert summary.ok and summary.stages["embed"]["embedded"] == 0  # nothing re-embedded
        assert summary.chunks_written == summary.points_total == summary.chunks
        assert set(fake.keys_seen) == {"k3y"}  # the API key went with every request
        resumed = point_ids(fake)

    with qdrant_server(api_key="k3y") as clean:
        run_ingest(server_config(corpus, tmp_path / "clean", clean.url))
        assert resumed == point_ids(clean)


@pytest.mark.slow
def test_qdrant_timeouts_and_503s_are_retried_then_fail_clearly(
    corpus: Path, tmp_path: Path
) -> None:
    with qdrant_server(api_key="k3y") as fake:
        cfg = server_config(corpus, tmp_path / "work", fake.url)
        fake.fail("503", on="PUT /collections/ragpipe/points", times=2)  # a short blip
        first = run_ingest(cfg)
        assert first.ok and first.points_total == first.chunks
        batches = -(-first.chunks // 8)  # store.batch_size 8, the last batch may be short
        assert fake.calls["PUT /collections/ragpipe/points"] == batches + 2
        stamps = fake.calls["PATCH /collections/ragpipe"]
        assert stamps == 2  # a session's token: when it starts writing, when it closes

        (corpus / "engines.md").write_text(topic_doc("engines", version=2), encoding="utf-8")
        fake.hang_s = 3  # longer than store.timeout_s (1 s)
        fake.fail("hang", on="POST /collections/ragpipe/points/delete")
        started = time.monotonic()
        with pytest.raises(StageError, match="failed delete after 3 attempt") as err:
            run_ingest(cfg)
        assert "timed out" in str(err.value).lower()
        assert time.monotonic() - started < 30  # 3 timeouts of 1 s plus 1.5 s of backoff
        # Stamped when the first write began; not again when the store closed after the
        # failure (that stamp waited out every retry once more before the run failed).
        assert fake.calls["PATCH /collections/ragpipe"] == stamps + 1
        assert manifest(cfg, "upsert") is not None  # the first run's, not this one's
        assert manifest(cfg, "upsert").counts["points_written"] == first.chunks  # type: ignore[union-attr]

        fake.fail(None)
        time.sleep(fake.hang_s)  # let the hung requests finish before comparing
        # A timed-out request may still have been carried out by the server (as a slow
        # real one would): the next run deletes whatever old version is left, if any.
        again = run_ingest(cfg)
        assert again.ok and again.chunks_written == 0
        final = point_ids(fake)

    with qdrant_server() as clean:
        clean_cfg = server_config(corpus, tmp_path / "clean", clean.url)
        run_ingest(clean_cfg)
        assert final == point_ids(clean)


@pytest.mark.slow
def test_ollama_dying_mid_embed_keeps_the_finished_parts(
    corpus: Path, tmp_path: Path, onnx_embedder: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:

    from ragpipe.ingest import embed as embed_stage

    monkeypatch.setattr(embed_stage, "PART_SIZE", 8)
    corpus = write_topics(tmp_path / "corpus6", 6)  # 24 chunks: more than the two parts
    with ollama_server({"all-minilm": onnx_embedder}) as (host, state):
        cfg = ollama_config(corpus, tmp_path, host, batch_size=8)
        state.down_after = 4  # two one-text probes (plan, embed), two batches, then it dies
        with pytest.raises(StageError, match="failed after 2 attempt"):
            run_ingest(cfg)
        assert manifest(cfg, "embed") is None and manifest(cfg, "upsert") is None
        parts = list((tmp_path / "work" / "embed" / "parts").glob("*.parquet"))
        assert len(parts) == 2  # the two finished parts are durable

        state.down_after = None
        summary = run_ingest(cfg)
        assert summary.ok and summary.points_total == summary.chunks
        assert summary.stages["embed"]["reused"] == 16  # 2 parts of 8 were not re-embedded
        assert summary.stages["embed"]["embedded"] == summary.chunks - 16


def test_ollama_timing_out_mid_embed_is_retried_then_fails_clearly(
    corpus: Path, tmp_path: Path, onnx_embedder: OnnxEmbedder
) -> None:
    with ollama_server({"all-minilm": onnx_embedder}) as (host, state):
        cfg = ollama_config(corpus, tmp_path, host, timeout_s=1)
        state.down_after, state.hang_s = 2, 3.0  # the two probes answer, then it hangs
        started = time.monotonic()
        with pytest.raises(StageError, match="failed after 2 attempt") as err:
            run_ingest(cfg)
        assert "timed out" in str(err.value).lower() and "ollama serve" in str(err.value)
        assert time.monotonic() - started < 20
        assert manifest(cfg, "embed") is None
        state.down_after = None
        # The server answers again: the next run completes, with a timeout to spare (on a
        # slow machine a real batch embedding took longer than the 1 s the hang is timed by).
        assert run_ingest(ollama_config(corpus, tmp_path, host, timeout_s=60)).ok


@pytest.mark.slow
def test_api_keys_never_reach_logs_artifacts_or_checkpoints(
    prefect_harness: None,
    corpus: Path,
    tmp_path: Path,
    onnx_embedder: OnnxEmbedder,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    import asyncio
    import logging

    from prefect.client.orchestration import get_client

    from flows.ingest import ingest_flow

    qdrant_key, ollama_key = "qk-secret-7777", "ok-secret-8888"
    caplog.set_level(logging.DEBUG)
    with (
        qdrant_server(api_key=qdrant_key) as fake,
        ollama_server({"all-minilm": onnx_embedder}) as (host, state),
    ):
        cfg = RagpipeConfig(
            discover={"roots": [corpus]},  # type: ignore[arg-type]
            embed={"provider": "ollama", "model": "all-minilm", "ollama_host": host,  # type: ignore[arg-type]
                   "ollama_api_key": ollama_key},
            store={"backend": "qdrant", "url": fake.url, "api_key": qdrant_key},  # type: ignore[arg-type]
            paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
        )  # fmt: skip
        summary = ingest_flow(config=cfg)
        assert summary.ok and summary.points_total > 0
        fake.fail("503", on="points/scroll")  # an error path too: its message and logs
        with pytest.raises(StageError):
            ingest_flow(config=cfg)
    # The keys were used: every request carried them ...
    assert set(fake.keys_seen) == {qdrant_key}
    assert {r["auth"] for r in state.requests} == {f"Bearer {ollama_key}"}

    # ... and were written nowhere: not in logs, output, artifacts, run parameters, files.
    async def stored_by_prefect() -> str:
        async with get_client() as client:
            artifacts = await client.read_artifacts()
            runs = await client.read_flow_runs()
        return json.dumps(
            [a.model_dump(mode="json") for a in artifacts]
            + [r.model_dump(mode="json") for r in runs]
        )

    out, err = capfd.readouterr()
    seen = [caplog.text, out, err, asyncio.run(stored_by_prefect())]
    seen += [
        p.read_bytes().decode("latin-1") for p in (tmp_path / "work").rglob("*") if p.is_file()
    ]
    for text in seen:
        assert qdrant_key not in text and ollama_key not in text
    assert "**********" in seen[3]  # the run parameters hold the masked values

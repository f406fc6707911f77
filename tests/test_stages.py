"""Stage runners end to end without Prefect: checkpoints, skips, resume, failures."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.errors import StageError
from ragpipe.ingest.chunk import run_chunk
from ragpipe.ingest.clean import run_clean
from ragpipe.ingest.convert import run_convert
from ragpipe.ingest.discover import run_discover
from ragpipe.ingest.summary import write_summary
from ragpipe.schemas import CHUNK_SCHEMA, Chunk, Document, Failure
from ragpipe.store import published

pytestmark = pytest.mark.slow


def _config(root: Path, work: Path, **chunk: object) -> RagpipeConfig:
    return RagpipeConfig(discover={"roots": [root]}, paths={"work_dir": work}, chunk=chunk or {})  # type: ignore[arg-type]  # nested dicts are validated by pydantic


def _run(cfg: RagpipeConfig):  # type: ignore[no-untyped-def]
    # Without plan on purpose: this checks each stage's own checkpoint reuse, which plan
    # would otherwise pre-empt (it hands convert only the added and changed files).
    d = run_discover(cfg)
    c = run_convert(cfg, d)
    k = run_clean(cfg, c)
    h = run_chunk(cfg, k)
    return write_summary(cfg, [d, c, k, h]), (d, c, k, h)


def test_checkpoints_rerun_and_config_change(small_corpus: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    cfg = _config(small_corpus, work)
    summary, (_, conv, _, chunked) = _run(cfg)
    assert (summary.seen, summary.converted, summary.skipped_unchanged, summary.failed) == (
        3,
        3,
        0,
        0,
    )
    assert conv.counts.by_converter["docling-native-pdf+ragpipe-structure"] == 1
    table = pq.read_table(work / "chunk" / "chunks.parquet")
    assert table.schema.equals(CHUNK_SCHEMA)
    assert table.num_rows == summary.chunks == chunked.counts.chunks > 10
    pages = {p for p in table.column("page").to_pylist() if p is not None}
    assert {1, 2, 3, 4} <= pages <= {1, 2, 3, 4, 5}
    assert max(table.column("token_count").to_pylist()) <= 256

    again, stages = _run(cfg)
    assert (again.converted, again.skipped_unchanged, again.chunks) == (0, 3, summary.chunks)
    assert all(s.reused for s in stages[1:])

    smaller = _config(small_corpus, work, size=400, overlap=40)
    resized, stages = _run(smaller)
    assert resized.converted == 0 and stages[1].reused and stages[2].reused
    assert not stages[3].reused and resized.chunks > summary.chunks


def test_changed_file_is_reconverted_alone(small_corpus: Path, tmp_path: Path) -> None:
    cfg = _config(small_corpus, tmp_path / "work")
    _run(cfg)
    (small_corpus / "notes.txt").write_text("Changed notes about the budget.\n")
    (small_corpus / "new.md").write_text("# New\n\nA new document.\n")
    summary, _ = _run(cfg)
    assert (summary.seen, summary.converted, summary.skipped_unchanged) == (4, 2, 2)
    docs = checkpoint.read_records(tmp_path / "work" / "convert" / "documents.parquet", Document)
    assert any("budget" in d.markdown for d in docs)


def test_crash_mid_convert_resumes_from_cached_documents(
    small_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(small_corpus, tmp_path / "work")
    discovered = run_discover(cfg)
    from ragpipe.ingest import convert as convert_module

    calls: list[str] = []

    def crash_on_third(real):  # type: ignore[no-untyped-def]
        def convert(self, source, fp):  # type: ignore[no-untyped-def]
            calls.append(source.file_path)
            if len(calls) == 3:
                raise StageError("simulated crash")
            return real(self, source, fp)

        return convert

    # The parent's side of the converter: handing files to the child (or converting them).
    for cls in (convert_module.Converter, convert_module.IsolatedConverter):
        monkeypatch.setattr(cls, "convert", crash_on_third(cls.convert))
    with pytest.raises(StageError):
        run_convert(cfg, discovered)
    assert checkpoint.read_manifest(tmp_path / "work" / "convert") is None  # not marked done
    assert len(list((tmp_path / "work" / "convert" / "cache").glob("*.parquet"))) == 2

    monkeypatch.undo()
    resumed = run_convert(cfg, discovered)
    assert (resumed.counts.converted, resumed.counts.skipped_unchanged) == (1, 2)


def test_bad_files_get_failure_rows_and_batch_completes(small_corpus: Path, tmp_path: Path) -> None:
    (small_corpus / "broken.pdf").write_bytes(b"%PDF-1.5\n" + os.urandom(3000))
    (small_corpus / "empty.txt").write_bytes(b"")
    (small_corpus / "junk.md").write_bytes(b"\x00\xff\xfe" * 100)
    (small_corpus / "latin1.txt").write_bytes("na\xefve".encode("latin-1"))
    (small_corpus / "huge.txt").write_text("x" * 300_000)
    cfg = RagpipeConfig(
        discover={"roots": [small_corpus], "max_file_bytes": 200_000},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
    )
    summary, _ = _run(cfg)
    assert summary.chunks > 0
    failures = checkpoint.read_records(tmp_path / "work" / "failures.parquet", Failure)
    got = sorted((Path(f.file_path).name, f.stage, f.category) for f in failures)
    assert got == [
        ("broken.pdf", "convert", "corrupt"),
        ("empty.txt", "convert", "empty"),
        ("huge.txt", "discover", "too_large"),
        ("junk.md", "convert", "binary"),
        ("latin1.txt", "convert", "encoding"),
    ]
    assert summary.failed == 5 and not summary.ok
    assert summary.skipped == 0
    on_disk = json.loads((tmp_path / "work" / "summary.json").read_text())
    assert on_disk["failed"] == 5 and len(on_disk["failures"]) == 5
    chunks = checkpoint.read_records(tmp_path / "work" / "chunk" / "chunks.parquet", Chunk)
    assert {Path(c.file_path).name for c in chunks} == {"multi_page.pdf", "amt.md", "notes.txt"}


def test_schema_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    checkpoint.write_records(path, [Failure("a", "s", "c", "m")], Failure)
    with pytest.raises(StageError, match="written by another ragpipe version"):
        checkpoint.read_records(path, Chunk)


# -- the stage cache key (Prefect's cache policy for the stage tasks) ------------------


def test_cache_keys_follow_exactly_the_settings_each_stage_reads(tmp_path: Path) -> None:
    from ragpipe.ingest.pipeline import STAGE_BY_NAME, cache_key
    from ragpipe.ingest.runner import StageSummary
    from tests.support.corpora import make_config

    cfg = make_config(tmp_path / "corpus", tmp_path)
    before = StageSummary("previous", "f" * 16, None, plan_id="p" * 32)

    def keys(config: RagpipeConfig) -> dict[str, str | None]:
        return {name: cache_key(config, stage, before) for name, stage in STAGE_BY_NAME.items()}

    cfg.store.path.mkdir(parents=True)  # an Edge store: its generation token keys the stages
    (cfg.store.path / "segments").mkdir()
    (cfg.store.path / "ragpipe-generation").write_text("g1")
    base = keys(cfg)
    assert base["discover"] is None  # the walk and the hashing always run
    assert all(base[s] for s in ("plan", "convert", "clean", "chunk", "embed", "upsert"))

    def changed(section: str, **update: object) -> list[str]:
        part = getattr(cfg, section).model_copy(update=update)
        new = keys(cfg.model_copy(update={section: part}))
        return [name for name in base if new[name] != base[name]]

    index_wide = ["plan", "chunk", "embed", "upsert"]  # what a stored point depends on
    assert changed("clean", hyphenation=False) == ["plan", "clean", *index_wide[1:]]
    assert changed("chunk", size=300) == index_wide
    assert changed("convert", heading_size_ratio=1.5) == ["plan", "convert", *index_wide[1:]]
    assert changed("convert", timeout_s=5.0) == []  # a limit refuses; it changes no output
    assert changed("embed", batch_size=4) == ["embed"]
    assert changed("index", max_delete_share=0.5) == ["upsert"]
    assert changed("eval", depth=12) == []

    # A write to the store (a new generation) re-keys the stages that read it.
    (cfg.store.path / "ragpipe-generation").write_text("g2")
    assert [name for name, key in keys(cfg).items() if key != base[name]] == [
        "plan", "embed", "upsert"
    ]  # fmt: skip
    # A lost or switched published version re-keys upsert alone (it publishes again).
    after_write = keys(cfg)
    published_root = published.root(cfg.store.path)
    published_root.mkdir()
    (published_root / "CURRENT").write_text("g2")
    assert [n for n, k in keys(cfg).items() if k != after_write[n]] == ["upsert"]
    with_dir = keys(cfg)
    (published_root / "g2").mkdir()
    assert keys(cfg) == with_dir  # a folder without its version file is no version
    version = published.IndexVersion("g2", "2026-12-03T00:00:00+00:00", 1, 1, "f")
    (published_root / "g2" / published.VERSION_FILE).write_text(json.dumps(asdict(version)))
    assert [n for n, k in keys(cfg).items() if k != with_dir[n]] == ["upsert"]
    whole = keys(cfg)  # and one cut short (its recorded sizes) is none either: upsert again
    (published_root / "g2" / published.SIZES_FILE).write_text('{"segments/x": 10}')
    assert [n for n, k in keys(cfg).items() if k != whole[n]] == ["upsert"]
    # Another input, another key; a qdrant server (no generation token) keys no store stage.
    other = StageSummary("previous", "e" * 16, None, plan_id="p" * 32)
    assert cache_key(cfg, STAGE_BY_NAME["chunk"], other) != base["chunk"]
    qdrant = make_config(tmp_path / "corpus", tmp_path, backend="qdrant")
    assert [n for n, s in STAGE_BY_NAME.items() if cache_key(qdrant, s, before)] == [
        "convert", "clean", "chunk"
    ]  # fmt: skip


def test_a_cached_stage_counts_as_reused_and_only_while_its_checkpoint_stands(
    small_corpus: Path, tmp_path: Path
) -> None:
    from ragpipe.ingest.runner import cached_summary

    cfg = _config(small_corpus, tmp_path / "work")
    converted = run_convert(cfg, run_discover(cfg))
    assert (converted.counts.converted, converted.counts.skipped_unchanged) == (3, 0)
    # Taken from an orchestrator's cache on a later night: nothing was converted then.
    cached = cached_summary(cfg, converted)
    assert cached is not None and cached.reused and cached.seconds == 0.0
    assert (cached.counts.converted, cached.counts.skipped_unchanged) == (0, 3)
    assert converted.counts.converted == 3  # the cached object itself is left as it was
    (tmp_path / "work" / "convert" / "documents.parquet").write_bytes(b"not parquet")
    assert cached_summary(cfg, converted) is None  # its checkpoint is gone: run the stage


def test_a_plan_is_named_by_what_it_says_so_an_unchanged_run_has_the_same_plan(
    small_corpus: Path, tmp_path: Path
) -> None:
    from ragpipe.ingest.plan import run_plan

    cfg = RagpipeConfig(
        discover={"roots": [small_corpus]},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"path": tmp_path / "store"},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
    )
    first = run_plan(cfg, run_discover(cfg)).plan_id
    assert run_plan(cfg, run_discover(cfg)).plan_id == first
    (small_corpus / "extra.md").write_text("# Extra\n\nOne more file.\n", encoding="utf-8")
    assert run_plan(cfg, run_discover(cfg)).plan_id != first
    elsewhere = cfg.model_copy(
        update={"store": cfg.store.model_copy(update={"path": tmp_path / "s2"})}
    )
    (small_corpus / "extra.md").unlink()
    assert run_plan(elsewhere, run_discover(elsewhere)).plan_id != first  # another store's plan

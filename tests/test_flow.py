"""The ingest flow and the CLI through a real Prefect test harness."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import RagpipeConfig

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_ingest_flow_runs_and_skips_on_rerun(
    prefect_harness: None, small_corpus: Path, tmp_path: Path
) -> None:
    from flows.ingest import ingest_flow

    cfg = RagpipeConfig(
        discover={"roots": [small_corpus]},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
    )
    first = ingest_flow(config=cfg)
    assert (first.seen, first.converted, first.failed) == (3, 3, 0)
    assert first.chunks > 10
    assert (tmp_path / "work" / "chunk" / "chunks.parquet").is_file()
    assert (tmp_path / "work" / "chunk" / "manifest.json").is_file()
    second = ingest_flow(config=cfg)
    assert (second.converted, second.skipped_unchanged, second.chunks) == (0, 3, first.chunks)


def test_cli_ingest_exit_codes(prefect_harness: None, small_corpus: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    work = tmp_path / "work"
    ok = runner.invoke(app, ["ingest", str(small_corpus), "--work-dir", str(work)])
    assert ok.exit_code == 0, ok.output
    assert "seen=3 converted=3 skipped-unchanged=0 failed=0" in ok.output

    (small_corpus / "bad.pdf").write_bytes(b"%PDF-1.4 truncated")
    (small_corpus / "link.md").symlink_to(small_corpus / "amt.md")
    bad = runner.invoke(app, ["ingest", str(small_corpus), "--work-dir", str(work)])
    assert bad.exit_code == 1, bad.output
    assert "seen=4 converted=0 skipped-unchanged=3 failed=1" in bad.output
    assert "corrupt" in bad.output
    assert "skipped=1" in bad.output and "skipped.parquet" in bad.output


def test_cli_config_error_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("chunk:\n  overlap: 5000\n")
    result = CliRunner().invoke(app, ["ingest", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "overlap (5000) must be smaller than size (1000)" in result.output


def test_cli_help_explains_options() -> None:
    result = CliRunner().invoke(app, ["ingest", "--help"])
    assert result.exit_code == 0
    for option in ("--config", "--work-dir", "--pdf-mode", "--chunker", "PATHS"):
        assert option in result.output

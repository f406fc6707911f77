"""Expected errors on the real command line: one clear line, the documented exit code,
no Prefect traceback or state lines (those only with --verbose)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.locking import ingest_lock
from tests.support.corpora import write_project

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RAGPIPE = str(Path(sys.executable).parent / "ragpipe")
GOLDEN = """
name: quiet
items:
  - id: oven
    query: How hot should the oven be?
    chunks: [{file: oven.md, heading: Oven, grade: 3}]
  - id: dough
    query: How long does the dough rise?
    chunks: [{file: dough.md, heading: Dough, grade: 3}]
"""
DOCS = {
    "oven.md": "# Oven\n\nBake bread at 230 degrees for forty minutes.\n",
    "dough.md": "# Dough\n\nThe dough rises for two hours in a warm place.\n",
    "flour.md": "# Flour\n\nStrong wheat flour has more protein.\n",
    "salt.md": "# Salt\n\nTwo percent salt by flour weight.\n",
}


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    done = subprocess.run(
        [RAGPIPE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )  # fmt: skip
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode, lines


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("quiet")
    write_project(root, DOCS, GOLDEN)
    rc, lines = _run("ingest", cwd=root)
    assert rc == 0, lines
    yield root


def _one_error(lines: list[str], prefix: str = "error:") -> str:
    assert not any("Traceback" in line or "Finished in state" in line for line in lines), lines
    assert len(lines) == 1 and lines[0].startswith(prefix), lines
    return lines[0]


def test_config_error(site: Path) -> None:
    rc, lines = _run("search", "oven", cwd=site, env={"RAGPIPE_RETRIEVE__TOP_K": "many"})
    assert rc == 2
    assert not any("Traceback" in line for line in lines)
    assert lines[0] == "error: invalid configuration (from ragpipe.yaml, RAGPIPE_* environment):"


def test_golden_set_missing(site: Path) -> None:
    rc, lines = _run("eval", "retrieval", "--golden", "nope.yaml", cwd=site)
    assert rc == 2
    assert _one_error(lines) == (
        "error: golden set nope.yaml not found (from the command line): pass "
        "--golden (eval.golden) with your golden set; its format: docs/reference/golden-format.md"
    )


def test_missing_index(site: Path) -> None:
    rc, lines = _run("search", "--store-path", "nowhere", "oven", cwd=site)
    assert rc == 2
    error = _one_error(lines)
    assert f"no index at {site / 'nowhere'}" in error  # the absolute path it looked at
    assert (
        f"store.path nowhere is relative, so it is taken from the working directory {site}" in error
    )


def test_lock_held(site: Path) -> None:
    cfg = RagpipeConfig.model_validate(
        {"store": {"path": str(site / "store")}, "paths": {"work_dir": str(site / "work")}}
    )
    with ingest_lock(cfg, timeout_s=0):
        rc, lines = _run("ingest", cwd=site, env={"RAGPIPE_INDEX__LOCK_TIMEOUT_S": "1"})
    assert rc == 2
    # It says at once that it waits (a warning), then gives up with one error line.
    assert not any("Traceback" in line or "Finished in state" in line for line in lines), lines
    assert lines[0].startswith("waiting for the ingest holding the index lock")
    (error,) = [line for line in lines if line.startswith("error:")]
    assert error == lines[-1] and "another ingest is writing to this index" in error
    assert f"pid {os.getpid()}" in error


def test_gate_failed(site: Path) -> None:
    rc, lines = _run("eval", "compare", "--variant", "a:mode=dense", "--variant", "b:mode=dense",
                     "--gate-metric", "mrr", "--gate-threshold", "0.5", cwd=site)  # fmt: skip
    assert rc == 4
    assert "b: mrr delta is +0.0000 on every one of the 2 paired queries (no CI" in _one_error(
        lines, "gate failed:"
    )


def test_mass_deletion_held(site: Path) -> None:
    for name in ("flour.md", "salt.md"):
        (site / "corpus" / name).unlink()
    rc, lines = _run("ingest", cwd=site)
    assert rc == 3
    assert not any("Traceback" in line or "Finished in state" in line for line in lines), lines
    assert lines[-1].startswith("deletions held: 2 of 4 indexed files vanished")
    assert len(lines) <= 2, lines  # the library's warning, then the one explanation

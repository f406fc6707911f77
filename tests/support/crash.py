"""Crash an ingest at a named point in a child process (see crash_ingest)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ragpipe.config import RagpipeConfig
from tests.support.paths import REPO


def crash(cfg: RagpipeConfig, point: str) -> None:
    child = subprocess.run(
        [sys.executable, "-m", "tests.support.crash_ingest", cfg.model_dump_json(), point],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr


def temp_files(cfg: RagpipeConfig) -> list[Path]:
    return sorted(cfg.paths.work_dir.rglob(".*.tmp"))

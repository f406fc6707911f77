"""One writer per index: a second ingest refuses (or waits) instead of interleaving."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.locking import ingest_lock, lock_path

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, **index: float) -> RagpipeConfig:
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.md").write_text("# A\n\nSome text about locks.\n", encoding="utf-8")
    return RagpipeConfig(
        discover={"roots": [corpus]},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"path": tmp_path / "store"},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
        index=index,  # type: ignore[arg-type]
    )


def test_a_second_ingest_refuses_while_one_runs(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with ingest_lock(cfg):  # as if another run were writing
        with pytest.raises(StageError, match=r"another ingest is writing to this index \(pid"):
            run_ingest(cfg)
        assert not (tmp_path / "work" / "discover").exists()  # refused before any work
    assert run_ingest(cfg).added == 1  # free again once the holder is done


def test_a_work_dir_or_store_under_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder\n", encoding="utf-8")
    cfg = _config(tmp_path)
    under = cfg.model_copy(update={"paths": cfg.paths.model_copy(
        update={"work_dir": tmp_path / "afile" / "work"})})  # fmt: skip
    with pytest.raises(ConfigError, match=r"cannot create the work dir lock .* set paths.work_dir"):
        run_ingest(under)  # was a NotADirectoryError traceback (exit 1)
    under = cfg.model_copy(update={"store": cfg.store.model_copy(
        update={"path": tmp_path / "afile" / "store"})})  # fmt: skip
    with pytest.raises(ConfigError, match=r"cannot create the index lock .* set store.path"):
        run_ingest(under)


def test_a_second_ingest_waits_when_asked(tmp_path: Path) -> None:
    cfg = _config(tmp_path, lock_timeout_s=30)
    held = threading.Event()

    def hold() -> None:
        with ingest_lock(cfg):
            held.set()
            time.sleep(1.5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    started = time.monotonic()
    summary = run_ingest(cfg)
    holder.join()
    assert summary.added == 1 and time.monotonic() - started >= 1.0  # it waited its turn


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    path = lock_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    script = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    with pytest.raises(StageError, match="another ingest"):
        run_ingest(cfg)
    proc.kill()  # SIGKILL: no cleanup code runs
    proc.wait()
    assert run_ingest(cfg).added == 1

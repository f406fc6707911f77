"""One writer per index across deployments: the Prefect global concurrency limit every
ingest flow takes before the file locks (on a real temporary Prefect API)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from ragpipe.config import RagpipeConfig

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, store: str) -> RagpipeConfig:
    return RagpipeConfig.model_validate(
        {"store": {"path": str(tmp_path / store)}, "paths": {"work_dir": str(tmp_path / "w")}}
    )


def test_a_second_writer_queues_for_the_slot_then_runs(
    prefect_harness: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from prefect.client.orchestration import get_client

    from flows.concurrency import writer_limit_name, writer_slot

    cfg = _config(tmp_path, "store")
    name = writer_limit_name(cfg)
    # The same index through a symlink is the same limit; another store has its own.
    (tmp_path / "link").symlink_to(tmp_path / "store", target_is_directory=True)
    (tmp_path / "store").mkdir()
    assert writer_limit_name(_config(tmp_path, "link")) == name
    assert writer_limit_name(_config(tmp_path, "other")) != name

    events: list[str] = []
    first_in = threading.Event()
    release = threading.Event()

    def first() -> None:
        with writer_slot(cfg):
            events.append("first in")
            first_in.set()
            release.wait(30)
            events.append("first out")

    def second() -> None:
        with writer_slot(cfg):
            events.append("second in")

    caplog.set_level(logging.INFO, logger="ragpipe")
    a = threading.Thread(target=first)
    a.start()
    assert first_in.wait(30)
    b = threading.Thread(target=second)
    b.start()
    time.sleep(4)  # longer than the first try: the second has said it waits
    assert events == ["first in"]
    release.set()
    a.join(60)
    b.join(60)
    assert events == ["first in", "first out", "second in"]
    waiting = [r.getMessage() for r in caplog.records if "waiting for the writer slot" in r.message]
    assert waiting and name in waiting[0] and "another ingest of this index" in waiting[0]
    assert any("got the writer slot" in r.getMessage() for r in caplog.records)

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
    assert (limit.limit, limit.active, limit.active_slots) == (1, True, 0)  # released

"""The HNSW build of an Edge store runs in a child process (``ragpipe.store.optimize``).

The engine holds the GIL for a whole build (6 minutes at a million points on 2
cores): in-process, no other thread runs and Ctrl-C waits for the end. These
tests build a real store of 64-dimensional points, so a build lasts a few
seconds, and check what a user would: progress is heard while it builds, an
interrupt or a killed build leaves the store as it was (and a later build
completes), and a build whose parent dies does not go on alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ragpipe.errors import StageError
from ragpipe.store import EdgeStore, IndexPoint, StoreMeta, edge

REPO = Path(__file__).resolve().parents[1]
POINTS, DIM = 12_000, 64


def _points() -> list[IndexPoint]:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((POINTS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [
        IndexPoint(
            str(uuid.UUID(int=i + 1)), vectors[i], [i % 97], [1.0],
            {"text": f"note {i}", "file_path": f"f{i // 10}.md", "chunk_index": i % 10},
        )
        for i in range(POINTS)
    ]  # fmt: skip


def _store(path: Path) -> EdgeStore:
    return EdgeStore(path, StoreMeta("test", DIM), batch_size=2048, hnsw_min_unindexed=1000)


@pytest.fixture
def unindexed_store(tmp_path: Path) -> Iterator[EdgeStore]:
    store = _store(tmp_path / "store")
    store.upsert(_points())
    yield store
    store.close()


def _builds(path: Path) -> list[int]:
    """Pids of build children working on ``path``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ragpipe.store.optimize" in cmdline and str(path).encode() in cmdline:
            found.append(int(proc.name))
    return found


def _indexed(store: EdgeStore) -> int:
    return int(store._shard.info().indexed_vectors_count)


def _unchanged_then_built(store: EdgeStore) -> None:
    """The store after a stopped build: every point searchable, all still waiting; then a
    build completes."""
    assert store.count() == POINTS and store.unindexed() == POINTS
    assert not _builds(store.path)
    probe = store.dense_vectors([str(uuid.UUID(int=7))])[str(uuid.UUID(int=7))]
    assert store.query_dense(probe, 1)[0].point_id == str(uuid.UUID(int=7))
    built = store.build_index(1000)
    assert built is not None and built.indexed == POINTS
    assert store.unindexed() == 0 and _indexed(store) >= POINTS


needs_proc = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")


def test_a_build_is_heard_from_while_it_runs(
    unindexed_store: EdgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(edge, "BUILD_HEARTBEAT_S", 0.1)
    heard: list[float] = []
    built = unindexed_store.build_index(1000, waiting=heard.append)
    assert built is not None and built.indexed == POINTS and unindexed_store.unindexed() == 0
    assert _indexed(unindexed_store) >= POINTS
    # The parent ran while the engine built: the beats came on time, not all at the end.
    assert len(heard) >= 3 and heard == sorted(heard)
    assert heard[0] < 0.5 and built.seconds - heard[-1] < 0.5


@needs_proc
def test_an_interrupted_build_stops_its_child_and_leaves_the_store_as_it_was(
    unindexed_store: EdgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(edge, "BUILD_HEARTBEAT_S", 0.1)
    seen: list[list[int]] = []

    def ctrl_c(seconds: float) -> None:  # what Ctrl-C raises in the waiting parent
        seen.append(_builds(unindexed_store.path))
        if seconds > 0.6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        unindexed_store.build_index(1000, waiting=ctrl_c)
    assert seen[-1], "the build child was running when interrupted"
    _unchanged_then_built(unindexed_store)


@needs_proc
def test_a_build_killed_from_outside_is_a_clear_error_and_loses_nothing(
    unindexed_store: EdgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(edge, "BUILD_HEARTBEAT_S", 0.1)

    def oom_killer(seconds: float) -> None:  # as the kernel's OOM killer would
        if seconds > 0.6:
            for pid in _builds(unindexed_store.path):
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(StageError, match=r"HNSW index .* failed \(exit -9\).*unchanged"):
        unindexed_store.build_index(1000, waiting=oom_killer)
    _unchanged_then_built(unindexed_store)


_PARENT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.test_index_build import _store
store = _store(Path(sys.argv[1]))
print("building", flush=True)
store.build_index(1000)
"""


@needs_proc
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_build_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = _store(path)
    store.upsert(_points())
    store.close()
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(path), str(REPO)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert parent.stdout is not None and parent.stdout.readline() == "building\n"
    deadline = time.monotonic() + 10
    while not _builds(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _builds(path), parent.stderr.read() if parent.stderr else ""
    parent.kill()  # SIGKILL: no Python cleanup runs in the parent
    parent.wait()
    deadline = time.monotonic() + 5
    while _builds(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _builds(path), "the orphaned build went on"
    reopened = _store(path)
    try:
        _unchanged_then_built(reopened)
    finally:
        reopened.close()


def _no_hnsw(params: object) -> bool:
    return getattr(params, "enable_hnsw", None) is False


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_new_store_has_the_graph_and_payload_indexes_ragpipe_chose(
    tmp_path: Path, on_disk: bool
) -> None:
    """m = HNSW_M, and no extra HNSW links for fields no search filters vectors on:
    Qdrant builds them per indexed value unless told not to, and for chunk_index that was
    a subgraph per position (bench/scale.py: 10x the links, 9x the build at 200k chunks).
    The engine records what each index was created with; the qdrant-client backend asks
    the same of a server (local mode keeps no indexes)."""
    from qdrant_client import models

    from ragpipe.store.base import HNSW_M, INTEGER_FIELDS, KEYWORD_FIELDS, NO_HNSW_FIELDS
    from ragpipe.store.qdrant import payload_index_params

    store = EdgeStore(tmp_path / "store", StoreMeta("test", DIM), on_disk=on_disk)
    schema = store._shard.info().payload_schema
    store.close()
    graph = (edge.edge_config(tmp_path / "store") or {})["hnsw_config"]
    assert (graph["m"], graph.get("on_disk")) == (HNSW_M, True if on_disk else None)
    assert {"chunk_index", "config_fingerprint"} <= NO_HNSW_FIELDS
    assert set(schema) == {*KEYWORD_FIELDS, *INTEGER_FIELDS, "text"}
    assert {name for name, info in schema.items() if _no_hnsw(info.params)} == NO_HNSW_FIELDS
    server = dict(payload_index_params(models, on_disk))
    assert set(server) == set(schema)
    assert {name for name, params in server.items() if _no_hnsw(params)} == NO_HNSW_FIELDS
    assert all(params.on_disk is (True if on_disk else None) for params in server.values())

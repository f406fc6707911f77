"""The attacker's cases (issue 16), kept as tests so they stay found.

A. a file name that is not UTF-8;  B. two runs sharing a work dir;
C. a kill while a new Edge store is created;  D. hostile text in output;
E. damaged or deleted store metadata;  F. a full disk.
Also: Prefect's ephemeral server after a SIGKILL, a run waiting on the lock,
a store reached through a symlink, a file of one 5 MB line, and the
crash-with-edits torture (kills at random points with edits between runs,
compared with a clean reference each time; ``RAGPIPE_TORTURE_ROUNDS`` for more).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from ragpipe import checkpoint
from ragpipe.config import DiscoverConfig, RagpipeConfig, StoreConfig
from ragpipe.errors import ConfigError, DiskFull, InputError, StageError
from ragpipe.ingest.chunk import run_chunk
from ragpipe.ingest.clean import run_clean
from ragpipe.ingest.convert import run_convert
from ragpipe.ingest.discover import discover, run_discover
from ragpipe.ingest.embed import run_embed
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.ingest.plan import run_plan
from ragpipe.locking import ingest_lock, lock_path
from ragpipe.query.render import terminal_safe, to_text, to_xml
from ragpipe.query.results import Retrieved
from ragpipe.store import (
    EMBEDDER_FIELD,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    META_FILE,
    EdgeStore,
    open_store,
    peek_meta,
)
from tests.support.corpora import TOPICS, make_config, stored, topic_doc, write_topics
from tests.support.crash_ingest import POINTS
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

ONNX = "paraphrase-MiniLM-L3-v2"
ALL_INDEXES = {*KEYWORD_FIELDS, *INTEGER_FIELDS, "text"}

# The tests' sites run on loopback: named, as a team names the hosts it lists.
LOOPBACK = ("127.0.0.1",)


def _text_corpus(root: Path, topics: list[str], version: int = 1) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for topic in topics:
        (root / f"{topic}.txt").write_text(topic_doc(topic, version), encoding="utf-8")
    return root


def _without_time(points: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {pid: {k: v for k, v in p.items() if k != "ingested_at"} for pid, p in points.items()}


# -- A. a file name that is not UTF-8 --------------------------------------------------


def test_a_file_name_that_is_not_utf8_is_a_failure_row_and_the_batch_goes_on(
    tmp_path: Path,
) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nApples.\n")
    bad = os.path.join(os.fsencode(root), b"bad_\xff\xfe_name.md")
    with open(bad, "wb") as fh:
        fh.write(b"# Bad name\n\nThe bytes of this name are not UTF-8.\n")
    result = discover(DiscoverConfig(roots=[root]))
    assert [f.file_path.rsplit("/", 1)[-1] for f in result.files] == ["good.md"]
    (failure,) = result.failures
    assert failure.category == "bad_name" and failure.file_path.endswith("bad_\\xff\\xfe_name.md")
    failure.file_path.encode("utf-8")  # storable as it is
    assert "b'" in failure.message and "convmv" in failure.message


def test_a_root_or_link_target_whose_name_is_not_utf8_is_a_failure_row_too(
    tmp_path: Path,
) -> None:
    """Only a file's own name was escaped: a missing root, an unreadable folder or a
    link's target named in bytes that are not UTF-8 made the failure row unwritable, and
    the whole run failed with UnicodeEncodeError, every night."""
    root = tmp_path / "docs"
    root.mkdir()
    (root / "good.md").write_text(topic_doc("engines"), encoding="utf-8")
    os.symlink(b"/gone/caf\xe9.md", os.path.join(os.fsencode(root), b"link.md"))
    gone = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"gone\xe9")))
    cfg = make_config(root, tmp_path, discover={"roots": [root, gone], "follow_symlinks": True})
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.ingest.summary import read_failures

    summary = run_ingest(cfg)
    assert summary.added == 1 and summary.failed == 2
    rows = {(f.category, f.file_path, f.message) for f in read_failures(WorkDir.of(cfg))}
    assert rows == {
        ("missing_root", f"{tmp_path.as_posix()}/gone\\xe9",
         f"root {tmp_path}/gone\\xe9 does not exist"),
        ("broken_link", f"{root.as_posix()}/link.md", "symlink target /gone/caf\\xe9.md missing"),
    }  # fmt: skip


# -- B. two runs sharing a work dir ----------------------------------------------------


def test_two_ingests_sharing_a_work_dir_take_turns_and_each_store_gets_its_own_corpus(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    corpus_a = _text_corpus(tmp_path / "a", TOPICS[:2])
    corpus_b = _text_corpus(tmp_path / "b", TOPICS[2:5])
    work = {"paths": {"work_dir": tmp_path / "work"}, "index": {"lock_timeout_s": 120}}
    cfg_a = make_config(corpus_a, tmp_path / "sa", **work)
    cfg_b = make_config(corpus_b, tmp_path / "sb", **work)
    results: dict[str, Any] = {}

    def run(name: str, cfg: RagpipeConfig) -> None:
        try:
            results[name] = run_ingest(cfg)
        except Exception as exc:  # reported below
            results[name] = exc

    with caplog.at_level(logging.WARNING, logger="ragpipe.locking"):
        threads = [threading.Thread(target=run, args=x) for x in (("a", cfg_a), ("b", cfg_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results["a"].added == 2 and results["b"].added == 3, results
    for cfg, topics in ((cfg_a, TOPICS[:2]), (cfg_b, TOPICS[2:5])):
        files = {Path(p["file_path"]).stem for p in stored(cfg).values()}
        assert files == set(topics)  # its own corpus, whole, and nothing of the other
    assert "waiting for the ingest holding the work dir lock" in caplog.text


def test_a_stage_refuses_a_checkpoint_another_run_wrote_into_its_work_dir(tmp_path: Path) -> None:
    work = {"paths": {"work_dir": tmp_path / "work"}}
    cfg_a = make_config(_text_corpus(tmp_path / "a", TOPICS[:2]), tmp_path / "sa", **work)
    cfg_b = make_config(_text_corpus(tmp_path / "b", TOPICS[2:4]), tmp_path / "sb", **work)
    discovered = run_discover(cfg_a)
    planned = run_plan(cfg_a, discovered)
    chunked = run_chunk(cfg_a, run_clean(cfg_a, run_convert(cfg_a, planned)))
    assert len(planned.plan_id) == 32 and chunked.plan_id == planned.plan_id
    run_ingest(cfg_b)  # another index's run, in the same work dir, meanwhile
    with pytest.raises(StageError, match=r"the chunk checkpoint in .* is not this run's"):
        run_embed(cfg_a, chunked)
    store = open_store(cfg_a.store, ONNX, None)
    assert store is None  # nothing of B's corpus reached A's store


def test_a_store_reached_through_a_symlink_is_the_same_index(tmp_path: Path) -> None:
    corpus = _text_corpus(tmp_path / "c", TOPICS[:1])
    real = make_config(corpus, tmp_path / "real")
    (tmp_path / "via").mkdir()
    (tmp_path / "via" / "store-edge").symlink_to(real.store.path, target_is_directory=True)
    linked = make_config(corpus, tmp_path / "via", paths={"work_dir": tmp_path / "w2"})
    assert lock_path(linked) == lock_path(real)
    with ingest_lock(real), pytest.raises(StageError, match="another ingest is writing to this"):
        run_ingest(linked)
    assert not linked.paths.work_dir.joinpath("discover").exists()  # refused before any work


# -- C. a kill while a new Edge store is created ---------------------------------------

_KILL_MID_CREATION = """
import os, signal, sys
from pathlib import Path
import qdrant_edge as qe
from ragpipe import store
from ragpipe.config import StoreConfig

def first_index_then_die(self, shard, on_disk):
    kind = qe.PayloadSchemaType.Keyword
    shard.update(qe.UpdateOperation.create_field_index("file_path", kind))
    shard.flush()
    os.kill(os.getpid(), signal.SIGKILL)

store.EdgeStore._repair_indexes = first_index_then_die
store.open_store(StoreConfig(path=Path(sys.argv[1])), "e", 8)
"""


def test_a_kill_while_a_store_is_created_leaves_no_half_store(tmp_path: Path) -> None:
    path = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", _KILL_MID_CREATION, str(path)], cwd=REPO, capture_output=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert not path.exists()  # the half-made shard is only in its temp dir
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == [".store.creating"]
    store = open_store(StoreConfig(path=path), "e", 8)
    assert isinstance(store, EdgeStore)
    assert set(store._shard.info().payload_schema) == ALL_INDEXES
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # leftover removed
    assert json.loads((path / META_FILE).read_text())["embedder"] == "e"


def test_a_store_missing_payload_indexes_is_repaired_at_its_next_write(tmp_path: Path) -> None:
    import qdrant_edge as qe

    from tests.support.points import DIM, make_points

    path = tmp_path / "store"
    config = qe.EdgeConfig(
        vectors={"dense": qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)},
        sparse_vectors={"bm25": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )
    shard = qe.EdgeShard.create(str(path), config)  # as the old code left it when killed
    shard.update(qe.UpdateOperation.create_field_index("file_path", qe.PayloadSchemaType.Keyword))
    shard.close()
    store = open_store(StoreConfig(path=path), "e", DIM)
    assert isinstance(store, EdgeStore)
    assert set(store._shard.info().payload_schema) == {"file_path"}  # reading repairs nothing
    store.upsert(make_points()[:2])
    schema = store._shard.info().payload_schema
    assert set(schema) == ALL_INDEXES
    assert schema["chunk_index"].params.enable_hnsw is False  # created as a new store's are
    store.close()


# -- D. hostile text in output ---------------------------------------------------------


def test_hostile_text_gives_well_formed_xml_and_inert_terminal_output() -> None:
    from ragpipe.query.results import RetrievalResult

    text = "bell\x07 esc\x1b[31mred\x1b]0;title\x07 vt\x0b bs\x08 csi\x9b2J & <tag> &lt; \ufffe end"
    hit = Retrieved(
        "p1", 0.5, {"text": text, "file_path": "a\x1b[1m.md", "heading_path": ["H\x07"]}
    )
    result = RetrievalResult("q", [hit])
    root = ElementTree.fromstring(to_xml(result))  # raises when not well-formed
    source = root.find("source")
    assert source is not None and source.get("file") == "a[1m.md" and source.get("heading") == "H"
    assert source.text == (
        "bell esc[31mred]0;title vt bs csi\x9b2J & <tag> &lt;  end"
    )  # forbidden characters dropped, markup escaped and read back verbatim
    shown = to_text(result)
    assert not any(c in shown for c in "\x07\x1b\x0b\x08\x9b")
    assert "<tag> &lt;" in shown and terminal_safe("tab\tnew\nline") == "tab\tnew\nline"


# -- E. damaged or deleted store metadata ----------------------------------------------


def test_damaged_store_metadata_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    config = StoreConfig(path=tmp_path / "store")
    store = open_store(config, "test-embedder", 8)
    assert store is not None
    store.close()
    (config.path / META_FILE).write_bytes(b"\x00garbage{")
    for opening in (lambda: open_store(config, "test-embedder", 8), lambda: peek_meta(config)):
        with pytest.raises(StageError, match=r"ragpipe-store\.json is unreadable or damaged"):
            opening()


def test_deleted_store_metadata_is_rebuilt_and_cannot_bypass_the_embedder_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(_text_corpus(tmp_path / "c", TOPICS[:2]), tmp_path)
    run_ingest(cfg)
    assert {p[EMBEDDER_FIELD] for p in stored(cfg).values()} == {ONNX}  # identity in the shard
    meta = cfg.store.path / META_FILE
    meta.unlink()
    with pytest.raises(ConfigError, match="built with embedder 'paraphrase-MiniLM-L3-v2'"):
        open_store(cfg.store, "all-MiniLM-L6-v2", None)  # search --embedder local
    assert not meta.exists()  # a refused open writes nothing
    with caplog.at_level(logging.WARNING, logger="ragpipe.store"):
        again = run_ingest(cfg)  # the nightly no-op
    assert again.ok and again.chunks_written == 0
    assert json.loads(meta.read_text()) | {"created_at": None} == {
        "embedder": ONNX, "dim": 384, "sparse": "qdrant-bm25", "schema": 1, "created_at": None
    }  # fmt: skip
    assert "was missing; rebuilt it from the store" in caplog.text


# -- F. a full disk --------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs (root only; skipped where mounting is not allowed)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_no_space_is_recognised_as_arrow_and_the_os_report_it() -> None:
    assert checkpoint.is_no_space(OSError(28, "No space left on device"))
    assert checkpoint.is_no_space(
        OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")
    )
    assert not checkpoint.is_no_space(OSError(13, "Permission denied"))


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Ctrl-C raising KeyboardInterrupt, as a command has it (a test before may have left
    another handler), and the one before given back afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_file_system_without_hard_links_still_creates_whole_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, default_sigint: None
) -> None:
    """atomic_create_bytes (a golden draft, init's files) publishes by hard link; FAT, exFAT
    and some network mounts refuse links (EPERM here, as Linux's vfat does). No such mount
    can be made here, so os.link is made to refuse as they do."""

    def no_links(src: str, dst: Path) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", src)

    monkeypatch.setattr(checkpoint.os, "link", no_links)
    target = tmp_path / "draft.yaml"
    checkpoint.atomic_create_bytes(target, b"items: []\n")
    assert target.read_bytes() == b"items: []\n"
    with pytest.raises(FileExistsError):  # an existing file is refused as with links
        checkpoint.atomic_create_bytes(target, b"other\n")
    assert target.read_bytes() == b"items: []\n"

    def interrupted(src: str, dst: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.atomic_create_bytes(tmp_path / "second.yaml", b"x\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.yaml"]  # no claim, no temp

    # The review: a signal raised as the claim's open returned (its fd never stored) left an
    # empty file, which blocked the name. Ctrl-C now waits until the claim is the file: a
    # real SIGINT sent as the claim is made lands after the rename.
    monkeypatch.undo()
    monkeypatch.setattr(checkpoint.os, "link", no_links)
    real_open = os.open

    def claimed_then_interrupted(path: Any, flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        if str(path).endswith("third.yaml"):  # the claim, not the temp file
            os.kill(os.getpid(), signal.SIGINT)
        return fd

    monkeypatch.setattr(checkpoint.os, "open", claimed_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.atomic_create_bytes(tmp_path / "third.yaml", b"x\n")
    assert (tmp_path / "third.yaml").read_bytes() == b"x\n"  # whole, not an empty claim
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.yaml", "third.yaml"]


def test_signals_deferred_holds_ctrl_c_until_the_block_ends(default_sigint: None) -> None:
    # A signal mask was not enough: another thread of the process takes the signal, and
    # Python raises KeyboardInterrupt in the main one all the same (pytest has threads).
    worker = threading.Thread(target=time.sleep, args=(0.5,))
    worker.start()
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), checkpoint.signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # a handler that raised would end it here
        done.append("both steps")
    worker.join()
    assert done == ["both steps"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_signals_deferred_acts_on_every_signal_and_a_second_ctrl_c_ends_it(
    default_sigint: None,
) -> None:
    # The review: of two signals held, only the first acted (a SIGTERM after a Ctrl-C was
    # dropped); and a block stuck on a hung file system could not be left at all.
    calls: list[str] = []

    def on_term(signum: int, frame: Any) -> None:
        calls.append("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with pytest.raises(KeyboardInterrupt), checkpoint.signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            calls.append("block done")
        assert calls == ["block done", "SIGTERM"]  # SIGTERM's handler ran after Ctrl-C's
        assert signal.getsignal(signal.SIGTERM) is on_term

        with pytest.raises(KeyboardInterrupt), checkpoint.signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)  # the second: out at once
            time.sleep(0.05)
            calls.append("not reached")
        assert "not reached" not in calls
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_files_written_whole_keep_the_umasks_mode(tmp_path: Path) -> None:
    # The review: the temp file was made 0o644, so under umask 002 a draft or init's files
    # lost the group write that open(path, "x") gave (0o664): a shared project broke.
    old = os.umask(0o002)
    try:
        checkpoint.atomic_create_bytes(tmp_path / "created.yaml", b"x\n")
        checkpoint.atomic_write_bytes(tmp_path / "replaced.json", b"{}")
    finally:
        os.umask(old)
    for name in ("created.yaml", "replaced.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o664


def test_the_cli_runs_off_the_main_thread(tmp_path: Path) -> None:
    # The review: every command set a SIGTERM handler, which only the main thread may: the
    # CLI invoked from a program's thread failed ('signal only works in main thread').
    from typer.testing import CliRunner

    from flows.cli import app

    got: list[Any] = []
    worker = threading.Thread(target=lambda: got.append(
        CliRunner().invoke(app, ["init", str(tmp_path / "project")])))  # fmt: skip
    worker.start()
    worker.join(60)
    assert got and got[0].exit_code == 0, got and got[0].output
    assert (tmp_path / "project" / "ragpipe.yaml").is_file()


def test_a_full_store_disk_is_one_clear_line_and_exit_2(tmpfs: Path, tmp_path: Path) -> None:
    corpus = _text_corpus(tmp_path / "c", TOPICS[:1])
    env = {**os.environ, "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore"}
    args = ["ingest", str(corpus), "--embedder", "onnx", "--work-dir", str(tmpfs / "work"),
            "--store-path", str(tmpfs / "store")]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=REPO, capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 2, out  # not a SIGBUS (135)
    assert out.count("error:") == 1 and "Traceback" not in out, out
    assert "no space left to write" in out and "MB needed" in out and "store.min_free_mb" in out
    assert not (tmpfs / "store").exists()  # stopped at plan: no Edge file was mapped
    assert not (tmpfs / "work" / "convert").exists()  # and nothing was converted first


def test_a_full_work_dir_stops_the_run_at_the_first_failed_write_then_converges(
    tmpfs: Path, tmp_path: Path
) -> None:
    corpus = _text_corpus(tmp_path / "c", TOPICS[:4])
    cfg = make_config(corpus, tmp_path, paths={"work_dir": tmpfs / "work"})
    filler = tmpfs / "filler"
    free = shutil.disk_usage(tmpfs).free
    filler.write_bytes(b"\0" * (free - 48 * 1024))  # room for discover, not for the rest
    with pytest.raises(DiskFull, match=r"no space left to write .*/work/.* free, about"):
        run_ingest(cfg)
    assert not (cfg.paths.work_dir / "failures.parquet").exists()  # no failure row per file
    assert list(tmpfs.rglob(".*.tmp")) == []  # nothing half-written kept
    filler.unlink()
    summary = run_ingest(cfg)
    assert summary.ok and summary.added == 4
    reference = make_config(corpus, tmp_path / "ref")
    run_ingest(reference)
    assert _without_time(stored(cfg)) == _without_time(stored(reference))


# -- Also ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_ingest_does_not_leave_prefects_server_running(tmp_path: Path) -> None:
    corpus = _text_corpus(tmp_path / "c", TOPICS)
    env = {**os.environ, "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore"}
    args = ["ingest", str(corpus), "--embedder", "onnx", "--work-dir", str(tmp_path / "w"),
            "--store-path", str(tmp_path / "s")]  # fmt: skip
    parent = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    server = None
    deadline = time.monotonic() + 120
    # The server is the child running uvicorn: another child may come and go first (it did,
    # and its /proc entry was gone before its command line was read).
    while server is None and time.monotonic() < deadline and parent.poll() is None:
        server = next((c for c in _children(parent.pid) if "uvicorn" in _cmdline(c)), None)
        time.sleep(0.2)
    assert server is not None, "the ingest never started Prefect's ephemeral server (uvicorn)"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = Path(f"/proc/{server}/stat").exists() and _state(server) != "Z"
    assert not alive, "Prefect's ephemeral server outlived the killed ingest"


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:  # gone already
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_one_line_data_file_is_a_failure_row_not_thousands_of_chunks(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "dump.txt").write_bytes(b"x " * 2_500_000)  # 5 MB, one line
    (root / "minified.html").write_bytes(b"<p>" + b"y " * 100_000 + b"</p>")  # HTML is exempt
    (root / "prose.md").write_text("# Prose\n\n" + "A normal paragraph.\n" * 1000)
    result = discover(DiscoverConfig(roots=[root]))
    assert sorted(Path(f.file_path).name for f in result.files) == ["minified.html", "prose.md"]
    (failure,) = result.failures
    assert failure.category == "long_line" and "a line of 5000000 bytes" in failure.message
    assert failure.source_sha256 is not None
    unlimited = discover(DiscoverConfig(roots=[root], max_line_bytes=0))
    assert len(unlimited.files) == 3 and unlimited.failures == []


# -- the crash-with-edits torture ------------------------------------------------------

TORTURE_ROUNDS = int(os.environ.get("RAGPIPE_TORTURE_ROUNDS", "3"))
TORTURE_SEED = int(os.environ.get("RAGPIPE_TORTURE_SEED", "16"))


def _edit(corpus: Path, rng: random.Random, generation: int) -> str:
    """Change two files, add one, remove one (never below three files)."""
    files = sorted(corpus.glob("*.txt"))
    changed = rng.sample(files, k=min(2, len(files)))
    for path in changed:
        path.write_text(topic_doc(path.stem, version=generation), encoding="utf-8")
    added = corpus / f"topic{generation}.txt"
    added.write_text(topic_doc(f"topic{generation}"), encoding="utf-8")
    removed = ""
    if len(files) > 3:
        gone = rng.choice([f for f in files if f not in changed])
        gone.unlink()
        removed = gone.name
    return f"changed {[p.name for p in changed]}, added {added.name}, removed {removed or '-'}"


@pytest.mark.slow
@pytest.mark.integration
def test_kills_at_random_points_with_edits_between_runs_always_converge(tmp_path: Path) -> None:
    rng = random.Random(TORTURE_SEED)
    corpus = _text_corpus(tmp_path / "corpus", TOPICS[:5])
    cfg = make_config(corpus, tmp_path / "index", index={"max_delete_share": 1.0})
    run_ingest(cfg)
    kills = 0
    for round_ in range(1, TORTURE_ROUNDS + 1):
        story = [_edit(corpus, rng, 10 * round_)]
        point = rng.choice(POINTS)
        child = subprocess.run(
            [sys.executable, "-m", "tests.support.crash_ingest", cfg.model_dump_json(), point],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        # 3: the run finished before reaching the point (e.g. nothing left to delete).
        assert child.returncode in (-signal.SIGKILL, 3), child.stdout + child.stderr
        kills += child.returncode < 0
        story.append(f"killed at {point}" if child.returncode < 0 else f"{point} not reached")
        if rng.random() < 0.5:  # the files change again before the re-run
            story.append(_edit(corpus, rng, 10 * round_ + 1))
        summary = run_ingest(cfg)
        reference = make_config(corpus, tmp_path / f"ref{round_}")
        run_ingest(reference)
        where = f"round {round_} (seed {TORTURE_SEED}): " + "; ".join(story)
        assert summary.ok, where
        assert _without_time(stored(cfg)) == _without_time(stored(reference)), where
        again = run_ingest(cfg)
        assert (again.chunks_written, again.chunks_deleted) == (0, 0), where
        shutil.rmtree(reference.store.path)
        shutil.rmtree(reference.paths.work_dir)
        print(where)
    assert kills, "no round reached its crash point: the torture tested nothing"


# -- issue 31: hostile web servers and clients ------------------------------------------


def _drip_headers(conn: Any) -> None:
    """Headers one byte every 0.3 s, for at most 30 s (finding 2)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n" + b"X-Slow: " + b"a" * 200
    for byte in head[:100]:
        conn.sendall(bytes([byte]))
        time.sleep(0.3)


def test_a_server_dripping_its_headers_is_cut_off_at_the_deadline() -> None:
    from ragpipe.config import FetchConfig
    from ragpipe.web.http import Fetcher, FetchError
    from ragpipe.web.robots import RobotsRules
    from tests.support.raw_server import raw_server

    with (
        raw_server(_drip_headers) as url,
        Fetcher(FetchConfig(timeout_s=2), listed_hosts=LOOPBACK) as fetcher,
    ):
        fetcher._robots[url] = RobotsRules.allow_all()  # the page alone, no robots.txt
        started = time.monotonic()
        with pytest.raises(FetchError) as err:
            fetcher.get(f"{url}/page")
        took = time.monotonic() - started
    # Before: httpx's read timeout restarted on every byte; the fetch sat 82 s.
    assert err.value.category == "timeout" and took < 4, took
    assert str(err.value).startswith("no response within fetch.timeout_s=2s")


def _bomb(encoding: str, payload: bytes) -> Any:
    def handle(conn: Any) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            + f"Content-Encoding: {encoding}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )

    return handle


def test_a_compression_bomb_is_refused_without_unpacking_it() -> None:
    import gzip
    import tracemalloc

    from ragpipe.config import FetchConfig
    from ragpipe.web.http import Fetcher, FetchError
    from ragpipe.web.robots import RobotsRules
    from tests.support.raw_server import raw_server

    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)  # 256 MiB in ~256 KB
    members = gzip.compress(b"A" * ((1 << 20) + 1)) + bomb + gzip.compress(b"C")
    config = FetchConfig(max_bytes=1 << 20)
    cases = {
        "gzip": (bomb, "too_large"),
        "gzip, gzip": (gzip.compress(bomb), "unsupported_encoding"),  # stacked: never asked
        # Members: the first fills the cap, the next is a bomb, a third follows. Before:
        # the second was read without a limit and the third crashed (ValueError).
        "x-gzip": (members, "too_large"),
        "br": (b"\x0b\x02\x80hello\x03", "unsupported_encoding"),
        "zstd": (b"(\xb5/\xfd\x00X)\x00\x00hello", "unsupported_encoding"),
    }
    for encoding, (payload, category) in cases.items():
        with (
            raw_server(_bomb(encoding, payload)) as url,
            Fetcher(config, listed_hosts=LOOPBACK) as fetcher,
        ):
            fetcher._robots[url] = RobotsRules.allow_all()
            tracemalloc.start()
            with pytest.raises(FetchError) as err:
                fetcher.get(f"{url}/bomb")
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert err.value.category == category, (encoding, err.value)
        # Before: 1,081 MB peak for a 512 MiB zstd bomb. Now the cap (1 MiB) bounds it.
        assert peak < 16 << 20, (encoding, peak)
    small = gzip.compress(b"hello " * 1000)
    with raw_server(_bomb("gzip", small)) as url, Fetcher(config, listed_hosts=LOOPBACK) as fetcher:
        fetcher._robots[url] = RobotsRules.allow_all()
        assert fetcher.get(f"{url}/ok").body == b"hello " * 1000  # gzip still works


def test_a_redirect_to_a_bad_port_is_a_failure_row_not_a_crash(tmp_path: Path) -> None:
    from tests.support.web_server import Route, web_site

    routes = {
        "/bad": Route(status=302, location="http://127.0.0.1:99999/x"),
        "/good": Route(b"<html><body><h1>Fine</h1><p>A healthy page.</p></body></html>"),
    }
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(topic_doc("engines"), encoding="utf-8")
    with web_site(routes) as site:
        cfg = make_config(
            docs, tmp_path, discover={"urls": [f"{site.url}/bad", f"{site.url}/good"]}
        )
        summary = run_ingest(cfg)  # before: ValueError: Port out of range, nothing indexed
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.ingest.summary import read_failures

    assert summary.failed == 1
    (bad,) = read_failures(WorkDir(cfg.paths.work_dir))
    assert (bad.file_path, bad.stage, bad.category) == (f"{site.url}/bad", "fetch", "bad_redirect")
    assert "http://127.0.0.1:99999/x" in bad.message and "not a valid URL" in bad.message
    files = {p["file_path"] for p in stored(cfg).values()}
    assert f"{site.url}/good" in files and any(f.endswith("a.md") for f in files)


def test_a_doubled_or_invalid_content_type_is_read_as_a_browser_reads_it(tmp_path: Path) -> None:
    """A server sending two Content-Type headers, or a bare word for one: read as text/plain
    (email's rule for an invalid value), its HTML was indexed markup and all."""
    from ragpipe.config import FetchConfig
    from ragpipe.web.pages import fetch_pages
    from tests.support.paths import shared_pdf
    from tests.support.web_server import Route, web_site
    from tests.test_fetch import GUIDE, _pages_config, _texts

    pdf = shared_pdf("multi_page.pdf").read_bytes()
    doubled = Route(GUIDE, "text/html", headers={"Content-Type": "text/html; charset=utf-8"})
    routes = {
        "/doubled": doubled,  # two Content-Type headers
        "/html": Route(GUIDE.replace(b"Install Guide", b"Bare Guide"), "html"),
        "/pdf": Route(pdf, "pdf"),
    }
    with web_site(routes) as site:
        u = site.url
        urls = [f"{u}/doubled", f"{u}/html", f"{u}/pdf"]
        fetched = fetch_pages(FetchConfig(), urls, [], tmp_path / "bodies", [])
        assert [(f.file_path, f.kind) for f in fetched.files] == [
            (f"{u}/doubled", "html"), (f"{u}/html", "html"), (f"{u}/pdf", "pdf")
        ]  # fmt: skip
        assert [(p.url, p.content_type) for p in fetched.pages] == [
            (f"{u}/doubled", "text/html"),
            (f"{u}/html", "text/html"),  # sniffed from the body, as the PDF is
            (f"{u}/pdf", "application/pdf"),
        ]
        assert fetched.failures == [] and fetched.skipped == []

        cfg = _pages_config(tmp_path / "ingest", [f"{u}/doubled"])
        run_ingest(cfg)
        assert _texts(stored(cfg)) == {
            f"{u}/doubled": [
                "# Install Guide\n\n## Requirements\n\nPython 3.11 or newer is needed to run the "
                "widget installer on Linux.",
                "## Steps\n\nRun pip install widget, then widget init inside the project folder.",
            ]
        }  # the page's text and headings, not its markup


def test_robots_wildcards_match_in_linear_time() -> None:
    from ragpipe.web.robots import RobotsRules

    rules = RobotsRules.parse("User-agent: *\nDisallow: /*a*a*a*a*a*a*a*a*a*b\n", "ragpipe")
    started = time.monotonic()
    assert rules.allowed("http://h/" + "a" * 70)  # no b: the rule does not match
    assert not rules.allowed("http://h/" + "a" * 70 + "b")
    assert time.monotonic() - started < 0.1  # before: 88 s of CPU


def test_an_empty_api_key_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    for empty in ("", "   "):
        monkeypatch.setenv("RAGPIPE_SERVE__API_KEY", empty)
        result = CliRunner().invoke(app, ["serve", "--port", "0"])
        # Before: "" == "" let every request in, and the start-up log named the variable.
        assert result.exit_code == 2, result.output
        assert "serve.api_key: is empty or blank" in " ".join(result.output.split())


def test_an_api_key_no_header_can_carry_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server strips the Authorization header and reads it as Latin-1: a key with a
    space at either end, or a letter outside Latin-1, never matched (every request got 401,
    the server said nothing); one with "é" only when a client sent it as Latin-1."""
    from pydantic import ValidationError
    from typer.testing import CliRunner

    from flows.cli import app
    from ragpipe.config import RagpipeConfig

    monkeypatch.setenv("RAGPIPE_SERVE__API_KEY", " s3cret")
    result = CliRunner().invoke(app, ["serve", "--port", "0"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "serve.api_key: holds a space or a character outside printable ASCII" in said
    assert "token_urlsafe" in said and "s3cret" not in said  # the fix, never the key
    monkeypatch.delenv("RAGPIPE_SERVE__API_KEY")
    for bad in ("s3cret ", "s3cret-t\u00f6ken", "\u043a\u043b\u044e\u0447", "two words",
                "tab\tkey", "nul\x00key"):  # fmt: skip
        with pytest.raises(ValidationError, match="outside printable ASCII"):
            RagpipeConfig.model_validate({"serve": {"api_key": bad}})
    for good in ("s3cret", "A-b_c.d~e+f/g==", "!#$%&'*,:;<>?@[]^`{|}"):
        key = RagpipeConfig.model_validate({"serve": {"api_key": good}}).serve.api_key
        assert key is not None and key.get_secret_value() == good


@pytest.mark.parametrize(
    "section",
    [("serve", "api_key"), ("llm", "api_key"), ("embed", "api_key"),
     ("embed", "ollama_api_key"), ("store", "api_key"), ("eval", "judge", "api_key")],
)  # fmt: skip
def test_a_config_error_never_shows_a_secret(section: tuple[str, ...], tmp_path: Path) -> None:
    """Every secret field given a value of the wrong type (a list of the key): the error
    names the field and never shows the value, nor does anything chained to it (pydantic's
    own error shows every input; eval.judge.api_key, inside an optional section, was shown)."""
    from ragpipe.config import ConfigError, load_config

    value: Any = ["s3cret-value-4711"]
    for name in reversed(section):
        value = {name: value}
    config = tmp_path / "ragpipe.yaml"
    config.write_text(json.dumps(value), encoding="utf-8")  # JSON is YAML
    with pytest.raises(ConfigError) as raised:
        load_config(config)
    said = "".join(traceback.format_exception(raised.value))
    assert f"{'.'.join(section)}: " in str(raised.value) and "s3cret-value-4711" not in said


def _alias_bomb(leaf: str) -> list[str]:
    """Anchors a..i, each nine references to the one before: *i stands for 9^9 values."""
    lines, previous = ["a: &a [" + ", ".join([leaf] * 9) + "]"], "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
        previous = name
    return lines


def test_a_yaml_alias_bomb_in_the_config_is_refused_at_once(tmp_path: Path) -> None:
    from ragpipe.config import load_config

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join([*_alias_bomb('"lol"'), "chunk: {size: *i}"]) + "\n", "utf-8")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"expands to more than 100,000 values through YAML"):
        load_config(bomb)
    assert time.monotonic() - started < 2  # before: 41 s and 1.4 GB, then "unknown field"
    friendly = tmp_path / "anchors.yaml"  # anchors a team uses to stay DRY still load
    friendly.write_text("chunk: &c {size: 800}\nembed: {batch_size: 16}\n", encoding="utf-8")
    assert load_config(friendly).chunk.size == 800


def test_a_yaml_alias_bomb_in_a_golden_set_or_labels_file_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """Our own attack (issue 31: "one new way nobody listed"): the config was guarded, but a
    golden set, the file an eval deployment takes as a parameter, was not: 1 KB of aliases
    ran `ragpipe eval check` past 120 s and 12.9 GB of memory (killed by `timeout`); the
    labels file of `eval rag --labels` likewise."""
    from ragpipe.evaluation.agreement import load_labels
    from ragpipe.evaluation.golden import load_golden

    golden = tmp_path / "bomb-golden.yaml"
    golden.write_text(
        "\n".join([*_alias_bomb('"a.md"'), "items:", "  - id: q1", "    query: What is R?",
                    "    expected_files: *i"]) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    labels = tmp_path / "bomb-labels.yaml"
    labels.write_text(
        "\n".join([*_alias_bomb("{item_id: q1, metric: faithfulness, value: 1}"), "labels: *i"])
        + "\n",
        encoding="utf-8",
    )
    for load, path in ((load_golden, golden), (load_labels, labels)):
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"expands to more than 5,000,000 values"):
            load(path)
        assert time.monotonic() - started < 10, path.name
    dry = tmp_path / "dry.yaml"  # anchors that stay DRY still load (held under an x- key)
    dry.write_text(
        "x-files: &f [a.md, b.md]\nitems:\n  - {id: q1, query: one, expected_files: *f}\n"
        "  - {id: q2, query: two, expected_files: *f}\n",
        encoding="utf-8",
    )
    assert [item.relevance for item in load_golden(dry).items] == [{"a.md": 1, "b.md": 1}] * 2
    # Any other key at the top is refused, and the message says where anchors may go.
    dry.write_text(dry.read_text(encoding="utf-8").replace("x-files", "files"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown keys \['files'\] .*keys starting with 'x-'"):
        load_golden(dry)


def test_numbers_past_any_sense_are_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    huge = "99999999999999999999"
    result = CliRunner().invoke(app, ["search", "x", "-k", huge])
    assert result.exit_code == 2 and "retrieve.top_k" in result.output  # before: OverflowError
    monkeypatch.setenv("RAGPIPE_RETRIEVE__TOP_K", huge)
    result = CliRunner().invoke(app, ["search", "x"])
    assert result.exit_code == 2 and "less than or equal to 10000" in result.output
    monkeypatch.delenv("RAGPIPE_RETRIEVE__TOP_K")
    # An infinite or astronomic wait was accepted, then crashed the fetcher's socket layer
    # (OverflowError) or its watchdog thread.
    for value, said in (("inf", "finite number"), ("1e300", "less than or equal to 604800")):
        monkeypatch.setenv("RAGPIPE_FETCH__TIMEOUT_S", value)
        result = CliRunner().invoke(app, ["search", "x"])
        assert result.exit_code == 2 and "fetch.timeout_s" in result.output, result.output
        assert said in result.output, result.output


def test_a_newline_in_a_file_name_cannot_fake_a_result_line() -> None:
    from ragpipe.query.results import RetrievalResult

    hit = Retrieved(
        "p1", 1.0, {"file_path": "a.md\n2. secrets.md  [x]  score=9", "heading_path": ["H\nI"],
                    "text": "body"},
    )  # fmt: skip
    text = to_text(RetrievalResult("q", [hit]))
    assert text.splitlines()[0] == "1. a.md\\n2. secrets.md  [x]  score=9  [H\\nI]  score=1  ()"
    assert len(text.splitlines()) == 2


def test_deeply_nested_html_is_a_failure_row_and_the_batch_goes_on(tmp_path: Path) -> None:
    from ragpipe.ingest.convert import html_depth
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.ingest.summary import read_failures

    docs = tmp_path / "docs"
    docs.mkdir()
    deep = "<html><body>" + "<div>" * 100_000 + "x" + "</div>" * 100_000 + "</body></html>"
    (docs / "deep.html").write_text(deep, encoding="utf-8")  # 1.1 MB
    for topic in TOPICS[:3]:
        (docs / f"{topic}.md").write_text(topic_doc(topic), encoding="utf-8")
    sloppy = "<html><body>" + "<p>para" * 5_000 + "<ul><li>a<li>b</ul></body></html>"
    (docs / "sloppy.html").write_text(sloppy, encoding="utf-8")  # unclosed <p>s: not deep
    cfg = make_config(docs, tmp_path)
    started = time.monotonic()
    summary = run_ingest(cfg)
    assert time.monotonic() - started < 120  # before: still converting after 600 s
    (failure,) = read_failures(WorkDir(cfg.paths.work_dir))
    assert failure.file_path.endswith("deep.html") and failure.category == "too_deep"
    assert "convert.max_html_depth=512" in failure.message
    assert summary.failed == 1
    files = {p["file_path"] for p in stored(cfg).values()}
    assert any(f.endswith("sloppy.html") for f in files) and len(files) == 4
    assert html_depth(sloppy, 512) == 3  # html, body, ul
    assert html_depth("<a><b/><br><c></c></a>", 512) == 2


def test_a_failed_file_is_retried_when_nothing_else_changed(tmp_path: Path) -> None:
    """A failure's cause can go away while the plan stays the same: a limit the checkpoint
    key leaves out raised (convert.max_html_depth, convert.timeout_s), a timeout under load,
    a file back in place. A stage that wrote failure rows is never reused, so the next run
    tries the file again (it used to repeat the old failure, message and all)."""
    from ragpipe.ingest.convert import ConvertCounts
    from ragpipe.ingest.runner import StageSummary, WorkDir, cached_summary
    from ragpipe.ingest.summary import read_failures

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(topic_doc("wings"), encoding="utf-8")
    deep = "<html><body>" + "<div>" * 30 + "<p>Deep text.</p>" + "</div>" * 30 + "</body></html>"
    (docs / "deep.html").write_text(deep, encoding="utf-8")
    strict = make_config(docs, tmp_path, convert={"max_html_depth": 20})
    assert run_ingest(strict).failed == 1
    second = run_ingest(strict)  # a.md unchanged, deep.html planned again
    assert second.failed == 1 and second.skipped_unchanged == 1
    summary = run_ingest(make_config(docs, tmp_path, convert={"max_html_depth": 512}))
    assert summary.failed == 0 and summary.added == 1
    assert read_failures(WorkDir(strict.paths.work_dir)) == []
    assert any(p["file_path"].endswith("deep.html") for p in stored(strict).values())
    # A Prefect run's cached stage result with failures is not taken either.
    manifest = checkpoint.read_manifest(WorkDir(strict.paths.work_dir).stage("convert"))
    assert manifest is not None
    for failed, taken in ((0, True), (1, False)):
        counts = ConvertCounts(documents=1, failed=failed)
        cached = StageSummary("convert", manifest.output_fingerprint, counts,
                              plan_id=manifest.plan_id)  # fmt: skip
        assert (cached_summary(strict, cached) is not None) is taken


def test_a_conversion_over_its_wall_clock_budget_is_stopped_and_the_batch_goes_on(
    tmp_path: Path,
) -> None:
    """The depth pre-check turned off, the nested HTML reaches Docling and would convert
    for over 600 s, holding the index lock; convert.timeout_s stops it in its child."""
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.ingest.summary import read_failures

    docs = tmp_path / "docs"
    docs.mkdir()
    deep = "<html><body>" + "<div>" * 100_000 + "x" + "</div>" * 100_000 + "</body></html>"
    (docs / "deep.html").write_text(deep, encoding="utf-8")
    for topic in TOPICS[:3]:
        (docs / f"{topic}.md").write_text(topic_doc(topic), encoding="utf-8")
    (docs / "page.html").write_text("<html><body><h1>Page</h1><p>Fine.</p></body></html>", "utf-8")
    cfg = make_config(docs, tmp_path, convert={"max_html_depth": 10**9, "timeout_s": 8})
    started = time.monotonic()
    summary = run_ingest(cfg)
    assert time.monotonic() - started < 90
    (failure,) = read_failures(WorkDir(cfg.paths.work_dir))
    assert failure.file_path.endswith("deep.html") and failure.category == "timeout"
    assert "convert.timeout_s (8 s)" in failure.message and summary.failed == 1
    files = {p["file_path"] for p in stored(cfg).values()}
    assert len(files) == 4 and any(f.endswith("page.html") for f in files)
    children = multiprocessing.active_children()
    assert not [c for c in children if c.name == "ragpipe-convert"]  # none left behind


def test_a_converter_that_dies_is_a_failure_row_and_the_next_file_converts(
    tmp_path: Path,
) -> None:
    from ragpipe.config import ConvertConfig
    from ragpipe.ingest.isolate import IsolatedConverter
    from ragpipe.schemas import SourceFile

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nFirst.\n", encoding="utf-8")

    def source(name: str) -> SourceFile:
        path = docs / name
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return SourceFile(str(path), str(path), str(docs), "markdown", path.stat().st_size, digest)

    with IsolatedConverter(ConvertConfig(), timeout_s=60) as converter:
        assert converter.convert(source("a.md"), "fp").markdown.startswith("# A")
        first = converter._process
        assert first is not None and first.pid is not None
        os.kill(first.pid, signal.SIGKILL)  # as the OOM killer would, mid-document
        with pytest.raises(InputError, match=r"converter process died .*exit -9") as died:
            converter.convert(source("a.md"), "fp")
        assert died.value.category == "crashed"
        again = converter.convert(source("a.md"), "fp")  # a new child
        assert again.markdown.startswith("# A") and converter._process is not first


def test_an_interrupted_run_leaves_no_converter_and_no_fork_server(tmp_path: Path) -> None:
    """CI on 2026-12-03: SIGTERM came while the fork server was starting (importing Docling,
    seconds): the run ended, but the server ran on holding its stdout, and the child it
    forked meanwhile found its parent's end closed with the reply unread and printed a
    ConnectionResetError traceback into the run's output."""
    from multiprocessing import forkserver

    from ragpipe.config import ConvertConfig
    from ragpipe.ingest.isolate import IsolatedConverter
    from ragpipe.schemas import SourceFile

    path = tmp_path / "a.md"
    path.write_text("# A\n\nFirst.\n", encoding="utf-8")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    source = SourceFile(str(path), str(path), str(tmp_path), "markdown", 13, digest)
    # A reply the parent never reads, then its end closed: the child ends quietly (exit 0).
    converter = IsolatedConverter(ConvertConfig(), timeout_s=60)
    conn = converter._child()
    child = converter._process
    assert child is not None
    conn.send((source, "fp"))
    assert conn.poll(60)  # the reply waits, unread
    conn.close()
    child.join(30)
    assert child.exitcode == 0
    # Interrupted inside: the child and the fork server are gone when the block ends.
    with pytest.raises(KeyboardInterrupt), IsolatedConverter(ConvertConfig(), 60) as converter:
        assert converter.convert(source, "fp").markdown.startswith("# A")
        second = converter._process
        server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        assert second is not None and server is not None
        raise KeyboardInterrupt
    assert second.exitcode == -signal.SIGKILL
    with pytest.raises(ChildProcessError):  # reaped: no such child any more
        os.waitpid(server, os.WNOHANG)
    with IsolatedConverter(ConvertConfig(), timeout_s=60) as converter:  # a new server
        assert converter.convert(source, "fp").markdown.startswith("# A")


def test_sitemaps_and_redirects_cannot_steer_the_fetcher_to_other_hosts(tmp_path: Path) -> None:
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.ingest.summary import read_failures
    from tests.support.web_server import Route, html_page, web_site

    page = html_page("Public", ("About", "A public page."))
    routes = {
        "/page": Route(page),
        "/secret": Route(html_page("Internal", ("Keys", "An internal page."))),
        "/open-redirect": Route(status=302, location="/"),  # set below: to another host
    }
    with web_site(routes) as site:
        internal = site.url.replace("127.0.0.1", "localhost") + "/secret"  # same box, other name
        site.routes["/open-redirect"] = Route(status=302, location=internal)
        site.routes["/sitemap.xml"] = Route(
            (
                '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                f"<url><loc>{site.url}/page</loc></url><url><loc>{internal}</loc></url></urlset>"
            ).encode(),
            "application/xml",
        )
        cfg = make_config(
            tmp_path / "none", tmp_path,
            discover={"roots": [], "urls": [f"{site.url}/open-redirect"],
                      "sitemaps": [f"{site.url}/sitemap.xml"]},
        )  # fmt: skip
        run_ingest(cfg)
        # Before: the sitemap's other-host entry was fetched, and the redirect followed, its
        # internal page indexed under the public URL.
        assert site.hits("/secret") == [] and site.hits("/page")
        failures = {f.file_path: f.category for f in read_failures(WorkDir(cfg.paths.work_dir))}
        assert failures == {
            internal: "sitemap_cross_host",
            f"{site.url}/open-redirect": "cross_host_redirect",
        }
        # Redirects to other hosts allowed: a non-public address the team did not list is
        # still refused, after DNS resolution (localhost is 127.0.0.1).
        from ragpipe.config import FetchConfig
        from ragpipe.web.http import Fetcher, FetchError

        trusting = FetchConfig(cross_host_redirects=True)
        with Fetcher(trusting, listed_hosts=LOOPBACK) as fetcher, pytest.raises(FetchError) as err:
            fetcher.get(f"{site.url}/open-redirect")
        assert err.value.category == "private_address" and "localhost resolves to" in str(err.value)
        assert site.hits("/secret") == []
        with Fetcher(trusting, listed_hosts=("127.0.0.1", "localhost")) as fetcher:
            assert fetcher.get(f"{site.url}/open-redirect").status == 200  # listed: allowed


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_that_ingests_at_import_is_told_to_guard_its_main(
    tmp_path: Path, guarded: bool
) -> None:
    """The converter's process re-imports the main script; one that converts at import
    (no main guard) would fail every file as 'crashed'. Instead the stage stops at once,
    naming the fix; with the guard the same script converts."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nFirst.\n", encoding="utf-8")
    body = f"""
import hashlib

from ragpipe.config import ConvertConfig
from ragpipe.ingest.isolate import IsolatedConverter
from ragpipe.schemas import SourceFile

def main():
    path = {str(docs / "a.md")!r}
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    source = SourceFile(path, path, {str(docs)!r}, "markdown", 13, digest)
    with IsolatedConverter(ConvertConfig(), timeout_s=60) as converter:
        print(converter.convert(source, "fp").markdown.splitlines()[0])
"""
    tail = '\nif __name__ == "__main__":\n    main()\n' if guarded else "\nmain()\n"
    script = tmp_path / "convert_at_import.py"
    script.write_text(body + tail, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    if guarded:
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "# A"
    else:
        assert done.returncode == 1
        assert "StageError: the converter process did not start" in done.stderr
        assert 'if __name__ == "__main__":' in done.stderr


def test_a_client_that_leaves_after_the_sources_event_stops_the_model(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """/ask streams the numbered sources before the first token (new this round): a client
    that reads them and hangs up before any token must not leave the model writing."""
    import httpx

    from ragpipe.serve.app import create_app
    from ragpipe.serve.server import running
    from tests.test_serve import Dripper, _index

    cfg = _index(tmp_path, cache=False)
    dripper = Dripper()
    with (
        running(create_app(cfg, onnx_embedder, dripper)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        body = {"question": "How long should bread bake?", "stream": "sse"}
        with client.stream("POST", "/ask", json=body) as got:
            lines = got.iter_lines()
            while "event: sources" not in next(lines):
                pass
            assert next(lines).startswith('data: {"sources": [{"number": 1')
        assert dripper.finished.wait(10)
        assert dripper.written < 200  # it stops at its next token or two, not after 1,000
        assert "ragpipe_answers_cancelled_total 1.0" in client.get("/metrics").text


def test_a_client_near_another_clients_query_gets_its_own_query_back_and_bad_k_refused(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """The search cache served a hit with the other client's query text in ``query`` (its
    own only under cache.cached_query); a damaged history under the reports is a 503 naming
    it, not a 500; k as true or "2" is refused as over HTTP."""
    import httpx

    from ragpipe.serve.app import create_app
    from ragpipe.serve.server import running
    from tests.test_serve import _index

    cfg = _index(tmp_path, cache_search=True)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "history.parquet").write_bytes(b"PAR1 not a parquet file")
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"reports_dir": reports})})
    hostile = "how long should bread bake\u0007"  # a control character, as a client may send
    with (
        running(create_app(cfg, onnx_embedder)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        first = client.post("/search", json={"query": "How long should bread bake?"}).json()
        again = client.post("/search", json={"query": hostile}).json()
        assert again["cache"]["hit"] is True and again["query"] == hostile
        assert again["hits"] == first["hits"]
        for k in (True, "2", 2.5):
            refused = client.post("/search", json={"query": hostile, "k": k})
            assert refused.status_code == 422, (k, refused.text)
        page = client.get("/reports/")
        assert page.status_code == 503
        assert "history.parquet is not a ragpipe history file" in page.json()["detail"]


def test_the_same_files_under_another_spelling_of_their_root_are_refused_not_doubled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docs` then `/abs/docs` (or a symlink to it): each file was a new one, the
    mass-deletion guard held the old entries and the new ones were written, so every
    document was in the index twice and every search hit came back twice."""
    corpus = write_topics(tmp_path / "corpus", 6, ".md")
    monkeypatch.chdir(tmp_path)
    cfg = make_config(Path("corpus"), tmp_path)
    first = run_ingest(cfg)
    for spelling in (tmp_path / "corpus", tmp_path / "link"):
        if spelling.name == "link":
            spelling.symlink_to(corpus, target_is_directory=True)
        moved = make_config(spelling, tmp_path)
        with pytest.raises(ConfigError) as err:
            run_ingest(moved)
        assert "6 indexed file(s) are the same files under another spelling" in str(err.value)
        assert "Spell the root as before ('corpus')" in str(err.value)
        assert len(stored(cfg)) == first.points_total  # nothing written
    relabelled = run_ingest(make_config(tmp_path / "link", tmp_path), allow_mass_delete=True)
    payloads = stored(cfg).values()
    assert relabelled.points_total == first.points_total == len(payloads)
    assert all(p["file_path"].startswith(f"{tmp_path}/link/") for p in payloads)


def test_a_file_rewritten_while_the_run_reads_it_is_not_indexed_from_that_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Discovery hashed v2; conversion read a half-written body; the document was stamped
    with v2's hash, so once the file settled back to v2 the next plan said "unchanged"
    and the half body stayed indexed for good."""
    from ragpipe.ingest import convert as convert_module
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.ingest.summary import read_failures

    root = _text_corpus(tmp_path / "docs", TOPICS[:2])
    cfg = make_config(root, tmp_path, convert={"timeout_s": 0})  # in this process
    run_ingest(cfg)
    wings = root / f"{TOPICS[0]}.txt"
    v2 = topic_doc(TOPICS[0], 2)
    wings.write_text(v2, encoding="utf-8")
    read = convert_module._read_text

    def mid_write(path: Path) -> str:
        if path == wings:
            path.write_text("# Half\n\nSentence 0 of section 0", encoding="utf-8")
        return read(path)

    monkeypatch.setattr(convert_module, "_read_text", mid_write)
    torn = run_ingest(cfg)
    assert torn.failed == 1
    (failure,) = read_failures(WorkDir.of(cfg))
    assert (failure.category, failure.file_path) == ("changed", wings.as_posix())
    texts = " ".join(p["text"] for p in stored(cfg).values())
    assert "# Half" not in texts and "Half" not in texts
    monkeypatch.setattr(convert_module, "_read_text", read)
    wings.write_text(v2, encoding="utf-8")  # settled back: the hash discovery saw
    settled = run_ingest(cfg)
    assert settled.changed == 1 and settled.failed == 0
    assert any(f"{TOPICS[0]} in revision 2" in p["text"] for p in stored(cfg).values())


def test_a_rebound_page_gets_nothing_from_a_loopback_server_and_a_bare_check_is_answered(
    tmp_path: Path, onnx_embedder: Any
) -> None:
    """DNS rebinding: a page whose name came to point at 127.0.0.1 sends same-origin
    requests naming its own host; only /mcp refused them, so /search, /ask and the reports
    were read. Refused now on every endpoint, in any order of headers; a load balancer's
    HTTP/1.0 check without Host, and the server's own names in any case, are answered."""
    import socket

    import httpx

    from ragpipe.serve.app import create_app
    from ragpipe.serve.server import running
    from tests.test_serve import _index

    cfg = _index(tmp_path)
    with running(create_app(cfg, onnx_embedder)) as url:
        port = int(url.rsplit(":", 1)[1])
        body = {"query": "How long should bread bake?"}
        for headers in ({"Host": f"evil.example:{port}"},
                        {"Origin": "http://evil.example"}):  # fmt: skip
            for method, path in (("POST", "/search"), ("GET", "/reports/"), ("GET", "/metrics")):
                got = httpx.request(method, f"{url}{path}", json=body, headers=headers)
                assert got.status_code in (403, 421) and "evil.example" in got.text, path
        assert httpx.post(f"{url}/search", json=body,
                          headers={"Host": f"LocalHost:{port}"}).status_code == 200  # fmt: skip
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")  # no Host at all
            assert conn.recv(64).startswith(b"HTTP/1.1 200")

"""The bad-input zoo: every kind of broken, odd or hostile file a real tree holds.

Each gets the right outcome (a failure row with a reason a user can act on,
or a deliberate skip), the rest of the batch is indexed, and the exit code
and summary count the failures.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from ragpipe import checkpoint
from ragpipe.config import DiscoverConfig, RagpipeConfig
from ragpipe.ingest.discover import discover
from ragpipe.ingest.pipeline import run_ingest, run_stages
from ragpipe.ingest.summary import write_summary
from ragpipe.models.embedders import embedder_name
from ragpipe.schemas import Chunk, Failure, Skip
from ragpipe.store import Where, open_store
from tests.support.paths import SHARED, shared_pdf

pytestmark = pytest.mark.integration

NOTES = "Plain notes.\n\nThe quarterly report is due on Friday. Send it to the team.\n"
ODD_NAME = "Überblick – Ärger & Co (draft) 2.md"


def _scanned_pdf(path: Path) -> None:
    """An image-only PDF: what a scanner writes, with no text layer."""
    from PIL import Image, ImageDraw

    page = Image.new("RGB", (1240, 1754), "white")
    ImageDraw.Draw(page).text((100, 100), "A SCANNED PAGE WITH NO TEXT LAYER", fill="black")
    page.save(path)


def _encrypted_pdf(path: Path) -> None:
    from pypdf import PdfWriter

    writer = PdfWriter(clone_from=shared_pdf("code_and_formula.pdf"))
    writer.encrypt(user_password="secret", owner_password="owner", algorithm="RC4-128")
    writer.write(path)


def build_zoo(root: Path) -> None:
    root.mkdir()
    shutil.copy(shared_pdf("multi_page.pdf"), root / "multi_page.pdf")
    shutil.copy(SHARED / "groundtruth" / "amt_handbook_sample.md", root / "amt.md")
    (root / "notes.txt").write_text(NOTES, encoding="utf-8")
    (root / "copy of notes.txt").write_text(NOTES, encoding="utf-8")  # same bytes
    (root / ODD_NAME).write_text("# Überblick\n\nÄrger über die Straße, naïve café.\n")
    (root / "corrupt.pdf").write_bytes(b"%PDF-1.7\n" + os.urandom(4000))
    (root / "fake.pdf").write_text("just text with a .pdf name")
    _encrypted_pdf(root / "encrypted.pdf")
    _scanned_pdf(root / "scanned.pdf")
    (root / "empty.md").write_bytes(b"")
    (root / "empty too.txt").write_bytes(b"")  # same (no) bytes: still a failure, not a dup
    (root / "junk.md").write_bytes(os.urandom(3000) + b"\x00")
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e".encode("latin-1"))
    (root / "huge.txt").write_bytes(b"x" * 300_000)
    (root / "boilerplate.md").write_text("Page 3 of 7\n\n© 2024 ACME Corp.\n")
    (root / "sub").mkdir()
    (root / "sub" / "loop").symlink_to(root)  # a directory link back up: a loop
    (root / "sub" / "dangling.md").symlink_to(root / "gone.md")
    os.mkfifo(root / "pipe.md")


EXPECTED_FAILURES = [
    ("boilerplate.md", "clean", "no_text"),
    ("corrupt.pdf", "convert", "corrupt"),
    ("dangling.md", "discover", "broken_link"),
    ("empty too.txt", "convert", "empty"),
    ("empty.md", "convert", "empty"),
    ("encrypted.pdf", "convert", "encrypted"),
    ("fake.pdf", "convert", "corrupt"),
    ("huge.txt", "discover", "too_large"),
    ("junk.md", "convert", "binary"),
    ("latin1.txt", "convert", "encoding"),
    ("scanned.pdf", "convert", "no_text"),
]


@pytest.mark.slow
@pytest.mark.integration
def test_bad_input_zoo_through_the_cli(prefect_harness: None, tmp_path: Path) -> None:
    root = tmp_path / "zoo"
    build_zoo(root)
    work = tmp_path / "work"
    config = tmp_path / "ragpipe.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "discover": {
                    "roots": [str(root)],
                    "max_file_bytes": 200_000,
                    "follow_symlinks": True,
                },
                "embed": {"provider": "onnx"},
                "store": {"path": str(tmp_path / "store")},
                "paths": {"work_dir": str(work)},
            }
        )
    )
    result = CliRunner().invoke(app, ["ingest", "--config", str(config)])
    assert result.exit_code == 1, result.output  # failures: exit 1, after indexing the rest
    assert "seen=13 added=13" in result.output and "failed=11" in result.output
    assert "duplicate_content: 1" in result.output and "not_a_file: 1" in result.output

    failures = checkpoint.read_records(work / "failures.parquet", Failure)
    got = sorted((Path(f.file_path).name, f.stage, f.category) for f in failures)
    assert got == EXPECTED_FAILURES
    messages = {Path(f.file_path).name: f.message for f in failures}
    assert "qpdf --decrypt" in messages["encrypted.pdf"]
    assert "no text layer" in messages["scanned.pdf"] and "do_ocr" in messages["scanned.pdf"]
    assert "iconv" in messages["latin1.txt"]
    assert "max_file_bytes=200000" in messages["huge.txt"]
    # A file over a lowered limit keeps what was indexed: said, with the way to remove it.
    assert "stays searchable until the file is added to discover.ignore" in messages["huge.txt"]
    assert all(m and "Traceback" not in m for m in messages.values())

    skipped = checkpoint.read_records(work / "discover" / "skipped.parquet", Skip)
    # The first path in sort order keeps the content ("copy of…" < "notes…").
    assert sorted((Path(s.file_path).name, s.reason) for s in skipped) == [
        ("notes.txt", "duplicate_content"),
        ("pipe.md", "not_a_file"),
    ]
    assert next(s.detail for s in skipped if s.reason == "duplicate_content").endswith(
        "/copy of notes.txt"
    )

    summary = json.loads((work / "summary.json").read_text())
    assert summary["failed"] == 11 and len(summary["failures"]) == 11
    assert summary["failures_by_category"]["convert:corrupt"] == 2

    # What is left is indexed, the odd name included, and findable by its path.
    chunks = checkpoint.read_records(work / "chunk" / "chunks.parquet", Chunk)
    assert {Path(c.file_path).name for c in chunks} == {
        "multi_page.pdf",
        "amt.md",
        "copy of notes.txt",
        ODD_NAME,
    }
    cfg = RagpipeConfig.model_validate(yaml.safe_load(config.read_text()))
    store = open_store(cfg.store, embedder_name(cfg.embed), None)
    assert store is not None
    try:
        odd = list(store.scroll(Where(must={"file_path": str(root / ODD_NAME)})))
        assert len(odd) == 1 and "Straße" in odd[0].payload["text"]
        assert store.count() == len(chunks)
    finally:
        store.close()

    # Fixing a file is picked up by the next run; the loop never made it walk forever.
    (root / "latin1.txt").write_text("café crème brûlée", encoding="utf-8")
    again = CliRunner().invoke(app, ["ingest", "--config", str(config)])
    # Failed files are retried each run (they are not in the index): 9 "added", 1 fixed.
    assert again.exit_code == 1, again.output
    assert "seen=13 added=9 changed=0 unchanged=4" in again.output
    assert "failed=10 chunks-written=1 " in again.output


def test_a_file_deleted_between_discover_and_convert(small_corpus: Path, tmp_path: Path) -> None:
    cfg = RagpipeConfig(
        discover={"roots": [small_corpus]},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"path": tmp_path / "store"},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
    )
    planned = run_stages(cfg, until="plan")
    (small_corpus / "notes.txt").unlink()  # gone before conversion reaches it
    summary = write_summary(cfg, run_stages(cfg, done=planned))
    (failure,) = checkpoint.read_records(tmp_path / "work" / "failures.parquet", Failure)
    assert (Path(failure.file_path).name, failure.stage, failure.category) == (
        "notes.txt",
        "convert",
        "vanished",
    )
    assert "deleted or moved after discovery" in failure.message
    assert summary.failed == 1 and summary.chunks_written == summary.chunks > 0

    after = run_ingest(cfg)  # the next run no longer sees it, and is clean
    assert after.ok and after.seen == 2 and after.chunks_written == 0


def test_a_five_megabyte_single_line_is_chunked_whole_when_allowed(tmp_path: Path) -> None:
    # By default such a file is a `long_line` failure row (tests/test_hostile.py); with
    # discover.max_line_bytes 0 the chunker must still handle it without going quadratic.
    root = tmp_path / "corpus"
    root.mkdir()
    line = " ".join(f"w{i}" for i in range(900_000))
    (root / "one-line.md").write_text(line)  # ~5.7 MB, no newline at all
    cfg = RagpipeConfig(
        discover={"roots": [root], "max_line_bytes": 0},  # type: ignore[arg-type]
        chunk={"size": 4000, "overlap": 100, "max_tokens": 2048},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
    )
    assert len(line) > 5_000_000
    chunked = run_stages(cfg, until="chunk")[-1]
    assert chunked.counts.failed == 0
    chunks = checkpoint.read_records(tmp_path / "work" / "chunk" / "chunks.parquet", Chunk)
    assert all(len(c.text) <= 4000 and c.token_count <= 2048 for c in chunks)
    assert all(c.text == line[c.char_start : c.char_end] for c in chunks)
    # Nothing lost: the chunks tile the line, each starting inside the one before.
    assert chunks[0].char_start == 0 and chunks[-1].char_end == len(line)
    assert all(b.char_start <= a.char_end for a, b in itertools.pairwise(chunks))
    assert {c.line_start for c in chunks} == {1}


def _discover_names(root: Path) -> dict[str, Any]:
    result = discover(DiscoverConfig(roots=[root]))
    return {
        "files": [Path(f.file_path).name for f in result.files],
        "failures": [(Path(f.file_path).name, f.category, f.message) for f in result.failures],
    }


def _as_nobody(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work`` in a forked child that dropped root for the user nobody."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            payload = json.dumps(work())
            code = 0
        except BaseException as exc:  # report, do not raise into the forked pytest
            payload = json.dumps({"error": repr(exc)})
        finally:
            with os.fdopen(write_end, "w") as out:
                out.write(payload)
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as inp:
        data = json.loads(inp.read())
    os.waitpid(pid, 0)
    assert "error" not in data, data
    return data


def test_an_unreadable_file_and_directory_get_failure_rows(tmp_path: Path) -> None:
    # Root reads every file whatever its mode: as root, discovery runs as 'nobody'
    # (in a directory nobody may enter; pytest's own tmp dirs are private to root).
    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="ragpipe-unreadable-")) if as_root else tmp_path
    base.chmod(0o755)
    try:
        (base / "ok.txt").write_text("readable\n")
        (base / "secret.txt").write_text("no one may read this\n")
        (base / "secret.txt").chmod(0o000)
        (base / "private").mkdir()
        (base / "private" / "inside.md").write_text("# hidden\n")
        (base / "private").chmod(0o000)
        seen = _as_nobody(lambda: _discover_names(base)) if as_root else _discover_names(base)
        assert seen["files"] == ["ok.txt"]
        assert sorted(map(list, seen["failures"])) == [
            ["private", "unreadable", "Permission denied"],
            ["secret.txt", "unreadable", "Permission denied"],
        ]
    finally:
        (base / "private").chmod(0o755)
        if as_root:
            shutil.rmtree(base)


def test_the_deletion_guard_counts_every_indexed_file(tmp_path: Path) -> None:
    """The guard's share is of every indexed file, as its message says: one file deleted
    of 10 (10 %, under the 20 % guard) is deleted while a root of 8 is unmounted. It used
    to count only the files the plan listed, 1 of 2 (50 %), and held it."""
    from tests.support.corpora import TOPICS, make_config, stored, topic_doc

    docs, more = tmp_path / "docs", tmp_path / "more"
    for folder, count, version in ((docs, 2, 1), (more, 8, 2)):
        folder.mkdir()
        for i in range(count):
            topic = TOPICS[i % len(TOPICS)]
            text = topic_doc(topic, version=version + 10 * i)
            (folder / f"{topic}-{i}.md").write_text(text, encoding="utf-8")
    cfg = make_config(docs, tmp_path, discover={"roots": [docs, more]})
    assert run_ingest(cfg).added == 10
    more.rename(tmp_path / "unmounted")
    gone = sorted(docs.iterdir())[0]
    gone.unlink()
    again = run_ingest(cfg)
    assert (again.removed, again.deletions_held) == (1, 0)
    assert again.failures_by_category == {"discover:missing_root": 1}
    files = {p["file_path"] for p in stored(cfg).values()}
    assert len(files) == 9 and not any(f.endswith(gone.name) and "docs" in f for f in files)


def test_a_folder_that_cannot_be_listed_keeps_its_indexed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second root gone (an unmounted share) and a directory that cannot be read this run
    # are failure rows; the files indexed below them stay, as an unreadable file's do.
    from tests.support.corpora import TOPICS, make_config, stored, topic_doc

    main, sub, other = tmp_path / "main", tmp_path / "main" / "sub", tmp_path / "other"
    for folder, topics in ((main, TOPICS[:2]), (sub, TOPICS[2:3]), (other, TOPICS[3:4])):
        folder.mkdir(parents=True, exist_ok=True)
        for topic in topics:
            (folder / f"{topic}.md").write_text(topic_doc(topic), encoding="utf-8")
    cfg = make_config(main, tmp_path, discover={"roots": [main, other]})
    assert run_ingest(cfg).added == 4
    files = {p["file_path"] for p in stored(cfg).values()}
    assert f"{sub.as_posix()}/statistics.md" in files

    other.rename(tmp_path / "unmounted")
    real_scandir = os.scandir

    def refused(path: Any = ".") -> Any:
        if Path(path) == sub:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refused)
    again = run_ingest(cfg)
    assert again.failures_by_category == {"discover:missing_root": 1, "discover:unreadable": 1}
    assert (again.removed, again.chunks_deleted) == (0, 0)
    assert {p["file_path"] for p in stored(cfg).values()} == files
    failures = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    assert sorted((f.file_path, f.category) for f in failures) == [
        (sub.as_posix(), "unreadable"), (other.as_posix(), "missing_root")
    ]  # fmt: skip

    monkeypatch.setattr(os, "scandir", real_scandir)
    cfg = make_config(main, tmp_path)  # the second root taken out of the config: its files go
    assert run_ingest(cfg, allow_mass_delete=True).removed == 1  # 1 of 4: over the 20 % guard

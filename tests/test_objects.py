"""Object-storage roots, end to end against a real S3-compatible server on loopback (moto's
server in its own process): add, change, delete, a 10,000-key listing, a bucket that
vanishes, a slow and a failing server, credentials from a Prefect Secret block."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragpipe import checkpoint
from ragpipe import config as config_module
from ragpipe.config import DiscoverConfig, RagpipeConfig, load_config, with_sources
from ragpipe.errors import ConfigError
from ragpipe.ingest.objects import list_objects, open_filesystem
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.schemas import Failure, Skip, StoredObject
from tests.support.corpora import stored, topic_doc
from tests.support.s3_server import CREDENTIALS, Faults, S3Server, faulty_proxy, s3_server

BUCKET = "team-docs"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Test credentials only; no ~/.aws files, no instance metadata."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


def _bucket(s3: S3Server, name: str, objects: dict[str, bytes]) -> Any:
    client = s3.client()
    client.create_bucket(Bucket=name)
    for key, body in objects.items():
        client.put_object(Bucket=name, Key=key, Body=body)
    return client


def _config(tmp_path: Path, endpoint: str, roots: list[Any], **storage: Any) -> RagpipeConfig:
    return RagpipeConfig(
        discover={"roots": roots},
        object_storage={"endpoint_url": endpoint, **storage},
        chunk={"size": 400, "overlap": 50},
        embed={"provider": "onnx", "batch_size": 16},
        store={"path": tmp_path / "store"},
        paths={"work_dir": tmp_path / "work"},
    )


def _by_file(cfg: RagpipeConfig) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for payload in stored(cfg).values():
        out.setdefault(payload["file_path"], set()).add(payload["source_sha"])
    return out


def _failures(cfg: RagpipeConfig) -> dict[str, str]:
    rows = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    return {f.file_path: f.category for f in rows}


def _failure_messages(cfg: RagpipeConfig) -> dict[str, str]:
    rows = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    return {f.file_path: f.message for f in rows}


# -- configuration ---------------------------------------------------------------------


def test_object_urls_in_roots_become_object_roots() -> None:
    cfg = DiscoverConfig(
        roots=["docs", "s3://team-docs/handbook/", "gs://other", "S3://team-docs/handbook"]
    )
    assert cfg.roots == [Path("docs")]
    # The scheme as objects are indexed under (lower case), each root once.
    assert cfg.object_roots == ["s3://team-docs/handbook", "gs://other"]
    assert DiscoverConfig(object_roots=["az://docs@account/kb"]).object_roots == [
        "az://docs@account/kb"
    ]  # adlfs's container@account is not a credential

    cli = with_sources(RagpipeConfig(), ["notes", "s3://b-1/x", "https://example.org/page"])
    assert cli.discover.roots == [Path("notes")]
    assert cli.discover.object_roots == ["s3://b-1/x"]
    assert cli.discover.urls == ["https://example.org/page"]


@pytest.mark.parametrize(
    ("root", "problem"),
    [
        ("s3://", "has no bucket; write it as s3://bucket/prefix"),
        ("s3://key:secret@bucket/x", "carries credentials or a query"),
        ("s3://bucket/x?X-Amz-Signature=secret@", "carries credentials or a query"),
        ("az://user:secret@account/x", "carries credentials or a query"),
        ("ftp://bucket/x", "is not an object-storage URL"),
    ],
)
def test_bad_object_roots_are_refused_at_load(tmp_path: Path, root: str, problem: str) -> None:
    path = tmp_path / "ragpipe.yaml"
    path.write_text(json.dumps({"discover": {"object_roots": [root]}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "discover.object_roots" in str(info.value)
    assert problem in str(info.value)
    assert "secret@" not in str(info.value)


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ({"options": {"key": "AKIA", "anon": False}}, "options: key look like credentials"),
        (
            {"options": {"client_kwargs": {"aws_secret_access_key": "secret@"}}},
            "options: client_kwargs.aws_secret_access_key look like credentials",
        ),
        (
            {"options": {"connection_string": "AccountKey=secret@"}},
            "options: connection_string look like credentials",
        ),
        ({"endpoint_url": "http://me:secret@minio:9000"}, "endpoint_url: carries credentials"),
    ],
)
def test_credentials_in_the_config_are_refused(
    tmp_path: Path, storage: dict[str, Any], message: str
) -> None:
    path = tmp_path / "ragpipe.yaml"
    path.write_text(json.dumps({"object_storage": storage}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"object_storage.{message}" in str(info.value)
    assert "credentials_block" in str(info.value)
    assert "secret@" not in str(info.value)


def test_a_missing_protocol_package_says_which_extra_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # not installed (an import fails)
    with pytest.raises(ConfigError) as info:
        open_filesystem("gs", RagpipeConfig().object_storage)
    assert str(info.value) == (
        "discover.object_roots: gs:// needs the gcsfs package; install it with "
        "`pip install 'ragpipe[gcs]'` (or `pip install gcsfs`)"
    )


# -- ingest ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_bucket_and_a_folder_in_one_nightly(s3: S3Server, tmp_path: Path) -> None:
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "gardening.md").write_text(topic_doc("gardening"))
    client = _bucket(
        s3,
        BUCKET,
        {
            "handbook/engines.md": topic_doc("engines").encode(),
            "handbook/deep/wings.txt": topic_doc("wings").encode(),
            "handbook/logo.png": b"\x89PNG not a document",
            "handbook/drafts/cooking.md": topic_doc("cooking").encode(),
            "handbook/": b"",  # a folder marker, as consoles create them
            "elsewhere/astronomy.md": topic_doc("astronomy").encode(),  # outside the prefix
        },
    )
    cfg = _config(tmp_path, s3.url, [folder, f"s3://{BUCKET}/handbook"])
    cfg = cfg.model_copy(
        update={"discover": cfg.discover.model_copy(update={"ignore": ["drafts/**"]})}
    )
    first = run_ingest(cfg)
    engines, wings = f"s3://{BUCKET}/handbook/engines.md", f"s3://{BUCKET}/handbook/deep/wings.txt"
    files = _by_file(cfg)
    assert sorted(files) == sorted([engines, wings, f"{folder}/gardening.md"])
    assert (first.added, first.failed) == (3, 0)
    assert first.stages["discover"]["objects_listed"] == 4  # the marker is not an object
    assert first.stages["discover"]["objects_downloaded"] == 2
    skips = checkpoint.read_records(cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)
    assert {(s.file_path, s.reason) for s in skips} == {
        (f"s3://{BUCKET}/handbook/logo.png", "unsupported_type")
    }
    texts = " ".join(p["text"] for p in stored(cfg).values() if p["file_path"] == engines)
    assert "Sentence 3 of section 1 explains engines in revision 1." in texts
    before = stored(cfg)

    # Nothing changed: one listing, no download, nothing converted or written.
    second = run_ingest(cfg)
    assert second.stages["discover"]["objects_listed"] == 4
    assert "objects_downloaded" not in second.stages["discover"]  # a count of 0 is left out
    assert (second.added, second.changed, second.skipped_unchanged) == (0, 0, 3)
    assert (second.chunks_written, second.chunks_deleted) == (0, 0)
    assert stored(cfg) == before

    # One key changes, one is deleted: only that key is downloaded and re-indexed.
    client.put_object(Bucket=BUCKET, Key="handbook/engines.md", Body=topic_doc("engines", 2))
    third = run_ingest(cfg)
    assert third.stages["discover"]["objects_downloaded"] == 1
    assert (third.changed, third.skipped_unchanged) == (1, 2)
    assert _by_file(cfg)[engines] != files[engines]
    assert _by_file(cfg)[wings] == files[wings]
    client.delete_object(Bucket=BUCKET, Key="handbook/deep/wings.txt")
    fourth = run_ingest(cfg, allow_mass_delete=True)  # 1 of 3 files is over the 20 % guard
    assert fourth.removed == 1
    assert sorted(_by_file(cfg)) == sorted([engines, f"{folder}/gardening.md"])
    state = checkpoint.read_records(
        cfg.paths.work_dir / "objects" / "objects.parquet", StoredObject
    )
    assert [o.url for o in state] == [engines]
    bodies = sorted(p.name for p in (cfg.paths.work_dir / "objects" / "bodies").iterdir())
    assert bodies == [Path(state[0].body_path).name]  # the old versions' bodies are pruned

    # The bucket vanishes: a missing root, which keeps every file indexed below it.
    client.delete_object(Bucket=BUCKET, Key="handbook/engines.md")
    for key in ("handbook/logo.png", "handbook/drafts/cooking.md", "handbook/"):
        client.delete_object(Bucket=BUCKET, Key=key)
    client.delete_object(Bucket=BUCKET, Key="elsewhere/astronomy.md")
    client.delete_bucket(Bucket=BUCKET)
    vanished = run_ingest(cfg)
    assert (vanished.removed, vanished.deletions_held) == (0, 0)
    assert _failures(cfg) == {f"s3://{BUCKET}/handbook": "missing_root"}
    assert engines in _by_file(cfg)


@pytest.mark.slow
def test_a_failing_or_slow_server_deletes_nothing(s3: S3Server, tmp_path: Path) -> None:
    _bucket(
        s3,
        "flaky-docs",
        {f"kb/{t}.md": topic_doc(t).encode() for t in ("engines", "wings", "gardening")},
    )
    faults = Faults()
    with faulty_proxy(s3.url, faults) as proxy:
        cfg = _config(tmp_path, proxy, ["s3://flaky-docs/kb"], retries=2, timeout_s=0.5)
        run_ingest(cfg)
        before = stored(cfg)
        assert len(_by_file(cfg)) == 3

        # Two 503s, then the server answers: the listing is retried and the night is clean.
        faults.fail_next = 2
        faults.requests.clear()
        retried = run_ingest(cfg)
        assert retried.failed == 0 and retried.skipped_unchanged == 3
        assert len(faults.requests) == 3  # two refused listings, one that worked

        # The server answers only 503: retries, then an 'unavailable' row; nothing deleted.
        faults.fail_all = True
        faults.requests.clear()
        down = run_ingest(cfg)
        assert len(faults.requests) == 3  # the first try and object_storage.retries=2
        assert _failures(cfg) == {"s3://flaky-docs/kb": "unavailable"}
        message = _failure_messages(cfg)["s3://flaky-docs/kb"]
        assert "after 2 retries; nothing indexed below it is deleted this run" in message
        assert (down.removed, down.deletions_held) == (0, 0)
        assert stored(cfg) == before

        # Slower than object_storage.timeout_s: the same, through read timeouts.
        faults.fail_all = False
        faults.delay_s = 1.0
        slow = run_ingest(cfg)
        assert _failures(cfg) == {"s3://flaky-docs/kb": "unavailable"}
        assert "timeout" in _failure_messages(cfg)["s3://flaky-docs/kb"].lower()
        assert slow.removed == 0
        assert stored(cfg) == before

        # Back to normal: the state survived the outage, so nothing is downloaded again.
        faults.delay_s = 0.0
        back = run_ingest(cfg)
        assert back.failed == 0 and "objects_downloaded" not in back.stages["discover"]


@pytest.mark.slow
def test_a_listing_of_ten_thousand_keys(s3: S3Server, tmp_path: Path) -> None:
    s3.fill("big-bucket", "notes/", 10_000)
    cfg = _config(tmp_path, s3.url, ["s3://big-bucket/notes"])
    bodies = tmp_path / "bodies"
    first = list_objects(cfg, cfg.discover.object_roots, [], bodies)
    assert (first.listed, first.downloaded, len(first.files)) == (10_000, 10_000, 10_000)
    assert first.failures == []
    assert first.files[9_999].file_path == "s3://big-bucket/notes/09999.txt"
    assert Path(first.files[9_999].abs_path).read_bytes() == b"object 9999\n"

    again = list_objects(cfg, cfg.discover.object_roots, first.objects, bodies)
    assert (again.listed, again.downloaded) == (10_000, 0)
    assert again.files == first.files


def test_credentials_from_a_prefect_secret_block(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _bucket(s3, "locked-docs", {"a/engines.md": topic_doc("engines").encode()})
    for name in CREDENTIALS:
        monkeypatch.delenv(name)
    # No credentials anywhere: a row that says so (not retried, and it deletes nothing).
    bare = _config(tmp_path, s3.url, ["s3://locked-docs/a"])
    result = list_objects(bare, bare.discover.object_roots, [], tmp_path / "bodies")
    assert [(f.file_path, f.category) for f in result.failures] == [
        ("s3://locked-docs/a", "no_credentials")
    ]
    assert "object_storage.credentials_block" in result.failures[0].message
    secret = json.dumps({"key": "block-key-id", "secret": "block-secret-VALUE"})
    read: list[str] = []

    def reader(name: str) -> str:
        read.append(name)
        return secret

    monkeypatch.setattr(config_module, "_secret_reader", reader)
    cfg = _config(tmp_path, s3.url, ["s3://locked-docs/a"], credentials_block="s3-docs")
    caplog.set_level(logging.DEBUG)
    result = list_objects(cfg, cfg.discover.object_roots, [], tmp_path / "bodies")
    assert [f.file_path for f in result.files] == ["s3://locked-docs/a/engines.md"]
    assert read == ["s3-docs"]
    assert "block-secret-VALUE" not in caplog.text

    monkeypatch.setattr(config_module, "_secret_reader", lambda name: "not json")
    with pytest.raises(ConfigError) as info:
        list_objects(cfg, cfg.discover.object_roots, [], tmp_path / "bodies")
    assert "must hold a JSON object of storage options" in str(info.value)


@pytest.mark.slow
def test_odd_keys_overlapping_roots_denied_and_failed_downloads(
    s3: S3Server, tmp_path: Path
) -> None:
    _bucket(
        s3,
        "odd-docs",
        {
            "kb/a b é#1.md": topic_doc("engines").encode(),
            "kb/x?versionId=abc.md": topic_doc("wings").encode(),
            "kb/sub/c.md": topic_doc("gardening").encode(),
            "top.md": topic_doc("cooking").encode(),
        },
    )
    faults = Faults()
    with faulty_proxy(s3.url, faults) as proxy:
        # Overlapping roots: each object once, under the first root that lists it.
        cfg = _config(tmp_path, proxy, ["s3://odd-docs", "s3://odd-docs/kb"])
        first = run_ingest(cfg)
        assert sorted(_by_file(cfg)) == [
            "s3://odd-docs/kb/a b é#1.md",
            "s3://odd-docs/kb/sub/c.md",
            "s3://odd-docs/top.md",
        ]
        assert (first.added, first.failed) == (3, 0)
        skips = checkpoint.read_records(cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)
        assert [(s.file_path, s.reason) for s in skips] == [
            ("s3://odd-docs/kb/x?versionId=abc.md", "unreadable_key")
        ]
        before = stored(cfg)

        # A changed object that cannot be downloaded: a row, and its indexed version stays.
        s3.client().put_object(Bucket="odd-docs", Key="kb/sub/c.md", Body=b"# New\n\nChanged.")
        faults.fail_paths = "/kb/sub/c.md"
        failed = run_ingest(cfg)
        assert _failures(cfg) == {"s3://odd-docs/kb/sub/c.md": "unreadable"}
        assert (failed.removed, failed.changed) == (0, 0)
        assert stored(cfg) == before

        # Access denied to the listing: a 'forbidden' row, not retried, nothing deleted.
        faults.fail_paths, faults.status = "list-type=2", 403
        faults.requests.clear()
        denied = run_ingest(cfg)
        assert _failures(cfg) == {"s3://odd-docs": "forbidden", "s3://odd-docs/kb": "forbidden"}
        assert len(faults.requests) == 2  # one listing per root
        assert "retries" not in _failure_messages(cfg)["s3://odd-docs"]
        assert denied.removed == 0 and stored(cfg) == before


@pytest.mark.parametrize("ignore", [["**"], ["*"], ["*.md"]])
def test_a_key_named_as_a_root_is_listed_whatever_the_ignore_globs_say(
    s3: S3Server, tmp_path: Path, ignore: list[str]
) -> None:
    """The globs match the key below its root; a root that is a key is listed as a file
    root is (** and * matched its empty remainder: it vanished without a row)."""
    if "key-roots" not in {b["Name"] for b in s3.client().list_buckets()["Buckets"]}:
        _bucket(s3, "key-roots", {"kb/a.md": b"# A\n\nalpha", "kb/sub/b.md": b"# B\n\nbeta"})
    cfg = _config(tmp_path, s3.url, ["s3://key-roots/kb/a.md", "s3://key-roots/kb"])
    cfg = cfg.model_copy(update={"discover": cfg.discover.model_copy(update={"ignore": ignore})})
    listed = list_objects(cfg, cfg.discover.object_roots, [], tmp_path / "bodies")
    assert [f.file_path for f in listed.files] == ["s3://key-roots/kb/a.md"]
    assert listed.failures == [] and listed.skipped == []


@pytest.mark.slow
def test_every_format_in_a_folder_and_a_bucket_in_one_nightly(s3: S3Server, tmp_path: Path) -> None:
    """Issue 36's "done when": PDF, DOCX, PPTX, XLSX, CSV, EPUB, EML, AsciiDoc, ODT (and the
    rest) in a folder, a PDF and a long CSV in a bucket; a change in either re-indexes only
    that file; a deleted key leaves the index; every chunk holding table rows has the header."""
    import shutil

    from tests.support.formats import write_docx_table, write_long_tables, write_samples
    from tests.support.paths import shared_pdf

    folder = tmp_path / "share"
    samples = write_samples(folder)
    write_long_tables(folder)
    write_docx_table(folder / "history.docx")
    shutil.copy(shared_pdf("multi_page.pdf"), folder / "multi_page.pdf")
    long_csv = write_long_tables(tmp_path / "for-bucket", rows=80)["csv"]
    client = _bucket(
        s3,
        "mixed-docs",
        {
            "kb/report.pdf": shared_pdf("right_to_left_01.pdf").read_bytes(),
            "kb/settings.csv": long_csv.read_bytes(),
            "kb/guide.md": topic_doc("engines").encode(),
        },
    )
    cfg = _config(tmp_path, s3.url, [folder, "s3://mixed-docs/kb"])
    cfg = cfg.model_copy(update={"index": cfg.index.model_copy(update={"max_delete_share": 0.5})})
    first = run_ingest(cfg)
    in_folder = len(samples) + 4  # the samples, two long tables, the DOCX, the PDF
    assert (first.added, first.failed) == (in_folder + 3, 0)
    kinds = {p.suffix for p in folder.iterdir()}
    assert {".pdf", ".docx", ".pptx", ".xlsx", ".csv", ".epub", ".eml", ".adoc", ".odt"} <= kinds
    files = _by_file(cfg)
    assert len(files) == in_folder + 3

    # Every chunk that holds table rows carries its table's header rows.
    import pyarrow.parquet as pq

    chunks = pq.read_table(cfg.paths.work_dir / "chunk" / "chunks.parquet").to_pylist()
    tables = 0
    for c in chunks:
        lines = c["text"].split("\n")
        rows = [i for i, line in enumerate(lines) if line.startswith("|")]
        if not rows:
            continue
        tables += 1
        first_row = rows[0]
        assert first_row + 1 < len(lines) and set(lines[first_row + 1]) <= {"|", "-", ":", " "}, (
            c["file_path"],
            c["text"][:200],
        )
    assert tables >= 15  # the CSVs, sheets and DOCX table are split into many parts

    # One file in the folder and one key change: only those two are re-indexed.
    (folder / "guide.adoc").write_text("= Client guide\n\n== Installing\n\nRun setup.exe.\n")
    client.put_object(Bucket="mixed-docs", Key="kb/guide.md", Body=topic_doc("engines", 2))
    second = run_ingest(cfg)
    assert (second.changed, second.added, second.removed) == (2, 0, 0)
    assert second.skipped_unchanged == in_folder + 1
    assert second.stages["discover"]["objects_downloaded"] == 1
    after = _by_file(cfg)
    assert after[f"{folder}/guide.adoc"] != files[f"{folder}/guide.adoc"]
    assert after["s3://mixed-docs/kb/report.pdf"] == files["s3://mixed-docs/kb/report.pdf"]

    # A deleted key leaves the index.
    client.delete_object(Bucket="mixed-docs", Key="kb/report.pdf")
    third = run_ingest(cfg)
    assert third.removed == 1
    assert "s3://mixed-docs/kb/report.pdf" not in _by_file(cfg)


@pytest.mark.slow
def test_a_widened_root_applies_records_rules_to_unchanged_objects(
    s3: S3Server, tmp_path: Path
) -> None:
    """Widened from s3://bkt/kb to s3://bkt, an unchanged object kept the root it was
    listed under (its whole saved state was reused): discover.records globs, relative to
    the root, never matched it, and its text copy stayed instead of giving way to the
    records."""
    from ragpipe.config import RecordsRule

    faq = [{"id": 1, "q": "How to reset?", "a": "Press the button."},
           {"id": 2, "q": "How to pay?", "a": "By card."}]  # fmt: skip
    _bucket(s3, "faq-docs", {"kb/faq.json": json.dumps(faq).encode()})
    rule = RecordsRule(glob="kb/*.json", text=["q", "a"], id="id")

    def config(root: str) -> RagpipeConfig:
        cfg = _config(tmp_path, s3.url, [root])
        return cfg.model_copy(
            update={"discover": cfg.discover.model_copy(update={"records": [rule]})}
        )

    narrow = config("s3://faq-docs/kb")
    run_ingest(narrow)
    assert sorted(_by_file(narrow)) == ["s3://faq-docs/kb/faq.json"]  # "faq.json": text
    wide = config("s3://faq-docs")
    run = run_ingest(wide, allow_mass_delete=True)  # the text copy gives way to the records
    assert "objects_downloaded" not in run.stages["discover"]  # unchanged: not downloaded
    assert sorted(_by_file(wide)) == ["s3://faq-docs/kb/faq.json#1", "s3://faq-docs/kb/faq.json#2"]
    assert (run.added, run.removed) == (2, 1)
    state = checkpoint.read_records(
        wide.paths.work_dir / "objects" / "objects.parquet", StoredObject
    )
    assert [(o.url, o.root) for o in state] == [("s3://faq-docs/kb/faq.json", "s3://faq-docs")]


def test_an_object_grown_past_the_limit_is_downloaded_once(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object that grew past discover.max_file_bytes after its listing was downloaded
    again and again (retries + 1 times, with backoff): its size does not pass."""
    from ragpipe.ingest import objects

    monkeypatch.setattr(objects, "BACKOFF_S", 0.0)
    _bucket(s3, "growing-docs", {"kb/a.txt": b"x" * 2000})
    faults = Faults()
    with faulty_proxy(s3.url, faults) as proxy:
        cfg = _config(tmp_path, proxy, ["s3://growing-docs/kb"])
        cfg = cfg.model_copy(
            update={"discover": cfg.discover.model_copy(update={"max_file_bytes": 1000})}
        )
        result = objects.ObjectsResult()
        # Listed at 500 bytes, 2000 when it is read.
        listed = ("growing-docs/kb/a.txt", "s3://growing-docs/kb/a.txt", "text", 500, "v1")
        fs = open_filesystem("s3", cfg.object_storage)
        objects._download_all(fs, "s3://growing-docs/kb", [listed], tmp_path / "bodies",
                              result, cfg, None)  # fmt: skip
    assert [(f.file_path, f.category, f.message) for f in result.failures] == [
        ("s3://growing-docs/kb/a.txt", "too_large",
         "2000 bytes exceeds discover.max_file_bytes=1000"),
    ]  # fmt: skip
    gets = [r for r in faults.requests if r.startswith("GET ") and "a.txt" in r]
    assert gets == ["GET /growing-docs/kb/a.txt"]  # once: before, 1 + object_storage.retries
    assert result.files == [] and list((tmp_path / "bodies").iterdir()) == []

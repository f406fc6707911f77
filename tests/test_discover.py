from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ragpipe.config import DiscoverConfig
from ragpipe.ingest.discover import discover, is_ignored


def _tree(root: Path) -> None:
    (root / "docs" / "sub").mkdir(parents=True)
    (root / "drafts").mkdir()
    (root / "docs" / "a.md").write_text("# A\n\ntext\n")
    (root / "docs" / "sub" / "b.txt").write_text("b\n")
    (root / "docs" / "c.py").write_text("print('c')\n")
    (root / "docs" / "d.bin").write_bytes(b"\x00\x01")
    (root / "drafts" / "e.md").write_text("draft\n")


def test_kinds_hashes_and_ignore(tmp_path: Path) -> None:
    _tree(tmp_path)
    cfg = DiscoverConfig(roots=[tmp_path], ignore=["drafts/**"])
    result = discover(cfg)
    rel = {Path(f.file_path).relative_to(tmp_path).as_posix(): f for f in result.files}
    assert sorted(rel) == ["docs/a.md", "docs/c.py", "docs/sub/b.txt"]
    assert rel["docs/a.md"].kind == "markdown" and rel["docs/c.py"].kind == "text"
    assert rel["docs/a.md"].sha256 == hashlib.sha256(b"# A\n\ntext\n").hexdigest()
    assert [s.reason for s in result.skipped] == ["unsupported_type"]
    assert result.failures == []


@pytest.mark.parametrize(
    ("path", "patterns", "ignored"),
    [
        ("drafts/x.md", ["drafts/**"], True),
        ("drafts", ["drafts/**"], True),
        ("docs/drafts/x.md", ["drafts/**"], False),
        ("docs/drafts/x.md", ["**/drafts/**"], True),
        ("a/b/c.log", ["*.log"], True),
        ("a/b/c.md", ["a/*.md"], False),
        ("a/c.md", ["a/*.md"], True),
        ("a/b/.DS_Store", ["**/.DS_Store"], True),
        # Like .gitignore: a trailing / is a folder (at any depth without another /), a
        # bare name a file or a folder at any depth, a leading / or ./ the root's.
        ("drafts/x.md", ["drafts/"], True),
        ("docs/drafts/sub/x.md", ["drafts/"], True),
        ("drafts", ["drafts/"], True),
        ("docs/drafts.md", ["drafts/"], False),
        ("drafts/x.md", ["drafts"], True),
        ("docs/drafts/x.md", ["drafts"], True),
        ("docs/drafts", ["drafts"], True),
        ("docs/drafts.md", ["drafts"], False),
        ("drafts/x.md", ["./drafts/**"], True),
        ("docs/drafts/x.md", ["./drafts/**"], False),
        ("drafts/x.md", ["./drafts"], True),
        ("docs/drafts/x.md", ["./drafts"], False),
        ("drafts/x.md", ["/drafts/"], True),
        ("docs/drafts/x.md", ["/drafts/"], False),
        ("docs/drafts/x.md", ["docs/drafts/"], True),
        ("a/docs/drafts/x.md", ["docs/drafts/"], False),
        ("a/b/c.md", ["a/*"], True),  # b is a folder a/* matches
        ("a/b/c.md", ["a/**/c.md"], True),
        ("a/c.md", ["a/**/c.md"], True),
        ("a/b.md/c.txt", ["*.md"], True),  # a folder named like a file
    ],
)
def test_ignore_globs(path: str, patterns: list[str], ignored: bool) -> None:
    assert is_ignored(path, patterns) is ignored


@pytest.mark.parametrize(
    ("path", "pattern", "ignored"),
    [
        # ** spans folders only as a whole part; elsewhere it is * (as in git)
        ("docs/y.md", "docs/**.md", True),
        ("docs/x/y.md", "docs/**.md", False),
        ("a/bc.md", "a/**c.md", True),
        ("a/b/c.md", "a/**c.md", False),
        ("mydir", "/**dir", True),
        ("my/dir", "/**dir", False),
        ("y.md", "***/**", True),  # *** is ** (top-level files were missed)
        ("d/a.md", "***/**", True),
        ("a/c.md", "a/***/c.md", True),
        ("a/b/c.md", "a/***/c.md", True),
        # \ makes the next character literal (they matched a backslash)
        ("#c.md", r"\#c.md", True),
        ("!n.md", r"\!n.md", True),
        ("q?.md", r"q\?.md", True),
        ("qx.md", r"q\?.md", False),
        ("x .md", r"x\ .md", True),
        ("[x].md", r"\[x].md", True),
        ("x.md", r"\[x].md", False),
        ("a*", r"a\*", True),
        ("ab", r"a\*", False),
        ("a\\b", r"a\\b", True),
        ("a.md ", "a.md\\ ", True),  # an escaped space at the end is kept
        ("a.md ", "a.md\\  ", True),  # (the unescaped one after it is dropped)
        ("a.md", "a.md\\ ", False),
        ("d/x/y/b.md", r"d/**\/b.md", True),  # **\/ is **/ without the zero folders
        ("d/b.md", r"d/**\/b.md", False),
        # [...]: ^ negates as ! does (it was a member), a ] first is a member, / is never
        # one, ranges and [:class:] as in git (a POSIX class never matched)
        ("y.md", "[^x].md", True),
        ("x.md", "[^x].md", False),
        ("].md", "[]x].md", True),
        ("x.md", "[]x].md", True),
        ("y.md", "[!]x].md", True),
        ("].md", "[!]x].md", False),
        ("a-b.md", "a[/-]b.md", True),
        ("a/b.md", "a[/-]b.md", False),
        ("a/b.md", "a[!x]b.md", False),
        ("x.md", "[[:alpha:]].md", True),
        ("1.md", "[[:alpha:]].md", False),
        ("_.md", "[[:digit:]_].md", True),
        ("%.md", "[![:alnum:]].md", True),
        ("z.md", "[z-a].md", True),  # git lists z, then finds the range empty
        ("a.md", "[z-a].md", False),
        ("x.md", "[[:foo:]].md", False),  # a class git does not know never matches
    ],
)
def test_ignore_globs_read_as_git_reads_them(path: str, pattern: str, ignored: bool) -> None:
    """A file's path against one pattern, as `git ls-files --ignored` answers."""
    from ragpipe.ingest.discover import IgnoreRules

    assert IgnoreRules([pattern]).ignores(path) is ignored


@pytest.mark.parametrize(
    "pattern", ["drafts/", "drafts", "./drafts/**", "./drafts", "/drafts", "drafts/**"]
)
def test_an_ignored_folder_is_not_walked(tmp_path: Path, pattern: str) -> None:
    """`drafts/`, `./drafts/**` and a bare `drafts` ignored nothing below drafts/ (only
    drafts/** and **/drafts/** did), though the docs said "like .gitignore"."""
    _tree(tmp_path)
    (tmp_path / "drafts" / "deeper").mkdir()
    (tmp_path / "drafts" / "deeper" / "f.md").write_text("draft\n")
    (tmp_path / "docs" / "drafts.md").write_text("not a folder\n")
    result = discover(DiscoverConfig(roots=[tmp_path], ignore=[pattern]))
    names = sorted(Path(f.file_path).relative_to(tmp_path).as_posix() for f in result.files)
    assert names == ["docs/a.md", "docs/c.py", "docs/drafts.md", "docs/sub/b.txt"]


def test_an_ignored_folder_below_a_root_and_in_object_keys(tmp_path: Path) -> None:
    """A folder pattern with no other '/' matches at any depth, as a bare name does;
    IgnoreRules.ignores (object keys, records globs: no walk) checks the folders too."""
    from ragpipe.ingest.discover import IgnoreRules

    _tree(tmp_path)
    (tmp_path / "docs" / "sub" / "drafts").mkdir()
    (tmp_path / "docs" / "sub" / "drafts" / "g.md").write_text("draft\n")
    result = discover(DiscoverConfig(roots=[tmp_path], ignore=["drafts/"]))
    names = sorted(Path(f.file_path).relative_to(tmp_path).as_posix() for f in result.files)
    assert names == ["docs/a.md", "docs/c.py", "docs/sub/b.txt"]
    rules = IgnoreRules(["drafts/", "/build"])
    assert [rules.ignores(k) for k in ("a/drafts/b/c.md", "drafts", "build/x", "a/build/x")] == [
        True, False, True, False
    ]  # fmt: skip
    # (a file named drafts is no folder)


def test_folders_below_a_folder_leave_its_own_files_in(tmp_path: Path) -> None:
    """`b/**/` is every folder below b, as in git: b/f.md was left out too (like b/**)."""
    from ragpipe.ingest.discover import IgnoreRules

    for rel in ("b/f.md", "b/sub/g.md", "b/sub/deeper/h.md", "c.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    result = discover(DiscoverConfig(roots=[tmp_path], ignore=["b/**/"]))
    names = sorted(Path(f.file_path).relative_to(tmp_path).as_posix() for f in result.files)
    assert names == ["b/f.md", "c.md"]
    rules = IgnoreRules(["b/**/"])  # object keys: the folders are read from the key
    assert [rules.ignores(k) for k in ("b/f.md", "b/sub/g.md", "b/sub/deeper/h.md")] == [
        False, True, True
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("/", "is empty once its slashes are dropped"),
        ("./", "is empty once its slashes are dropped"),
        ("docs/../drafts/**", "has an empty, '.' or '..' part"),
        ("docs//drafts", "has an empty, '.' or '..' part"),
        ("./.", "has an empty, '.' or '..' part"),
        ("!keep.md", "starts with '!', but discover.ignore has no negation"),
        (" !keep.md", "starts with '!', but discover.ignore has no negation"),
        ("", "is blank: it matches nothing"),
        ("  ", "is blank: it matches nothing"),
        ("[[:letter:]]*.md", "names the character class [:letter:], which git does not know"),
    ],
)
def test_an_ignore_pattern_that_never_matches_is_warned_about_at_load(
    pattern: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="ragpipe.config"):
        DiscoverConfig(ignore=[".git/**", pattern, "drafts/", "./drafts", "*.log"])
    (record,) = caplog.records  # the patterns that can match are not warned about
    assert record.getMessage().startswith(f"discover.ignore: the pattern {pattern!r} {problem}")


@pytest.mark.parametrize(
    ("pattern", "kept"),
    [
        ("/!keep.md", ["docs/!keep.md", "keep.md"]),
        ("./!keep.md", ["docs/!keep.md", "keep.md"]),
        ("docs/!keep.md", ["!keep.md", "keep.md"]),
        (r"\!keep.md", ["keep.md"]),
    ],
)
def test_a_bang_that_is_no_negation_in_git_is_not_warned_about(
    pattern: str, kept: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a '!' that starts the pattern is git's negation: /!keep.md and ./!keep.md were
    warned about ("no negation") though they ignore the file !keep.md, as in git."""
    (tmp_path / "docs").mkdir()
    for name in ("!keep.md", "docs/!keep.md", "keep.md"):
        (tmp_path / name).write_text(f"# {name}\n")
    with caplog.at_level("WARNING", logger="ragpipe.config"):
        cfg = DiscoverConfig(roots=[tmp_path], ignore=[pattern])
    assert caplog.records == []
    result = discover(cfg)
    assert sorted(Path(f.file_path).relative_to(tmp_path).as_posix() for f in result.files) == kept


def test_roots_merge_and_deduplicate(tmp_path: Path) -> None:
    _tree(tmp_path)
    cfg = DiscoverConfig(roots=[tmp_path / "docs", tmp_path / "docs" / "sub", tmp_path / "missing"])
    result = discover(cfg)
    names = [Path(f.file_path).name for f in result.files]
    assert sorted(names) == ["a.md", "b.txt", "c.py"]  # b.txt once, though under both roots
    assert [(f.category, f.stage) for f in result.failures] == [("missing_root", "discover")]


def test_symlinks_skipped_followed_broken_and_looped(tmp_path: Path) -> None:
    _tree(tmp_path)
    docs = tmp_path / "docs"
    os.symlink(docs / "a.md", docs / "link.md")
    os.symlink(tmp_path / "nowhere.md", docs / "broken.md")
    os.symlink(docs, docs / "sub" / "loop")
    off = discover(DiscoverConfig(roots=[docs]))
    assert sorted(s.reason for s in off.skipped if s.reason == "symlink") == ["symlink"] * 3
    assert off.failures == []

    on = discover(DiscoverConfig(roots=[docs], follow_symlinks=True))
    assert sorted(Path(f.file_path).name for f in on.files) == ["a.md", "b.txt", "c.py"]
    assert [f.category for f in on.failures] == ["broken_link"]

    # A link that sorts first, to a file or a folder, never takes the real path's place
    # (0link.md and asub/b.txt were indexed instead of a.md and sub/b.txt, silently).
    os.symlink(docs / "a.md", docs / "0link.md")
    os.symlink(docs / "sub", docs / "asub")
    first = discover(DiscoverConfig(roots=[docs], follow_symlinks=True))
    root = docs.as_posix()
    assert sorted(f.file_path for f in first.files) == [
        f"{root}/a.md", f"{root}/c.py", f"{root}/sub/b.txt"
    ]  # fmt: skip
    assert sorted((s.file_path, s.detail) for s in first.skipped if s.reason == "same_file") == [
        (f"{root}/0link.md", f"a link to {root}/a.md"),
        (f"{root}/link.md", f"a link to {root}/a.md"),
    ]  # (asub is the folder sub, walked already: not walked again, as a loop is not)
    # A link to a file outside the roots is indexed under the link's path, as before.
    outside = tmp_path / "drafts" / "e.md"
    os.symlink(outside, docs / "e-link.md")
    linked = discover(DiscoverConfig(roots=[docs], follow_symlinks=True))
    assert f"{root}/e-link.md" in {f.file_path for f in linked.files}


def test_a_symlink_loop_is_named_and_overlapping_roots_say_each_path_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """loopA -> loopB -> loopA was 'symlink target loopB missing', though loopB exists; with
    roots [docs, docs/sub] each link below docs/sub was a row twice (a failure row each
    followed, a symlink skip row each not), and so was a file of a type not ingested."""
    _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    sub = Path("docs/sub")
    os.symlink("loopB", sub / "loopA")
    os.symlink("loopA", sub / "loopB")
    os.symlink("gone.md", sub / "dangling.md")
    (sub / "e.bin").write_bytes(b"\x00")
    os.symlink(tmp_path / "drafts" / "e.md", sub / "outside.md")  # a file no root holds
    roots = [Path("docs"), sub]

    on = discover(DiscoverConfig(roots=roots, follow_symlinks=True))
    assert [(f.file_path, f.category, f.message) for f in on.failures] == [
        ("docs/sub/dangling.md", "broken_link", "symlink target gone.md missing"),
        ("docs/sub/loopA", "broken_link",
         "symlink loop: loopA -> loopB -> loopA never reaches a file or folder"),
        ("docs/sub/loopB", "broken_link",
         "symlink loop: loopB -> loopA -> loopB never reaches a file or folder"),
    ]  # fmt: skip
    assert [f.file_path for f in on.files] == [
        "docs/a.md", "docs/c.py", "docs/sub/b.txt", "docs/sub/outside.md"
    ]  # fmt: skip
    assert sorted((s.file_path, s.reason) for s in on.skipped) == [
        ("docs/d.bin", "unsupported_type"), ("docs/sub/e.bin", "unsupported_type")
    ]  # fmt: skip
    # (and no 'same_file: a link to docs/sub/outside.md' row of the link itself)

    off = discover(DiscoverConfig(roots=roots))
    assert off.failures == []
    assert sorted((s.file_path, s.reason) for s in off.skipped) == [
        ("docs/d.bin", "unsupported_type"),
        ("docs/sub/dangling.md", "symlink"),
        ("docs/sub/e.bin", "unsupported_type"),
        ("docs/sub/loopA", "symlink"),
        ("docs/sub/loopB", "symlink"),
        ("docs/sub/outside.md", "symlink"),
    ]

    # A folder link (up -> ..) lets the root docs/sub, walked first, reach the loop link
    # docs/loop under a second path: it is said under its own.
    os.symlink("loop", Path("docs/loop"))
    os.symlink("..", sub / "up")
    first = discover(DiscoverConfig(roots=[sub, Path("docs")], follow_symlinks=True))
    assert [f.file_path for f in first.failures] == [
        "docs/sub/dangling.md", "docs/sub/loopA", "docs/sub/loopB", "docs/loop"
    ]  # fmt: skip
    # (not docs/sub/up/loop as well)
    assert first.failures[-1].message == "symlink loop: loop -> loop never reaches a file or folder"


def test_oversize_file_gets_failure_row(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("x" * 2000)
    (tmp_path / "ok.txt").write_text("fine")
    result = discover(DiscoverConfig(roots=[tmp_path], max_file_bytes=1000))
    assert [Path(f.file_path).name for f in result.files] == ["ok.txt"]
    assert [(Path(f.file_path).name, f.category) for f in result.failures] == [
        ("big.txt", "too_large")
    ]


def test_a_lone_carriage_return_ends_a_line(tmp_path: Path) -> None:
    """Lines were split on \\n only: a 163 KB text file with \\r line endings (old Mac) was
    one line of 163 KB, a long_line failure, though with \\r\\n it passed and convert reads
    a lone \\r as a line break."""
    line = b"word " * 16  # 80 bytes
    (tmp_path / "mac.txt").write_bytes((line + b"\r") * 2048)  # 165,888 bytes
    (tmp_path / "dos.txt").write_bytes((line + b"\r\n") * 2048)
    long = line + b"\r" + b"x" * 150_000 + b"\r" + line
    (tmp_path / "long.txt").write_bytes(long)
    result = discover(DiscoverConfig(roots=[tmp_path]))  # max_line_bytes 100,000
    assert sorted(Path(f.file_path).name for f in result.files) == ["dos.txt", "mac.txt"]
    assert [(Path(f.file_path).name, f.category, f.source_sha256) for f in result.failures] == [
        ("long.txt", "long_line", hashlib.sha256(long).hexdigest())
    ]
    assert result.failures[0].message.startswith("a line of 150000 bytes ")
    mac = next(f for f in result.files if f.file_path.endswith("mac.txt"))
    assert mac.sha256 == hashlib.sha256((line + b"\r") * 2048).hexdigest()


def test_single_file_root_and_stable_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = discover(DiscoverConfig(roots=[Path("docs/a.md"), Path("docs")]))
    assert [f.file_path for f in result.files] == ["docs/a.md", "docs/c.py", "docs/sub/b.txt"]


def test_a_file_named_as_a_root_is_indexed_whatever_the_ignore_globs_say(tmp_path: Path) -> None:
    """The globs match below a root, as a folder root is walked whatever its name; a file
    root that matched one (roots: [notes.md], ignore: ['*.md']) vanished without a row."""
    _tree(tmp_path)
    cfg = DiscoverConfig(
        roots=[tmp_path / "docs" / "a.md", tmp_path / "drafts", tmp_path / "docs"],
        ignore=["*.md", "drafts"],
    )
    result = discover(cfg)
    assert [Path(f.file_path).relative_to(tmp_path).as_posix() for f in result.files] == [
        "docs/a.md", "docs/c.py", "docs/sub/b.txt"
    ]  # fmt: skip
    # (drafts/e.md is below a root, the folder drafts: *.md leaves it out)
    assert [s.reason for s in result.skipped] == ["unsupported_type"] and result.failures == []


def test_a_fifo_is_skipped_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.md")  # opening it for reading would block forever
    (tmp_path / "ok.md").write_text("fine")
    result = discover(DiscoverConfig(roots=[tmp_path]))
    assert [Path(f.file_path).name for f in result.files] == ["ok.md"]
    assert [(Path(s.file_path).name, s.reason) for s in result.skipped] == [
        ("pipe.md", "not_a_file")
    ]


def test_everything_below_an_ignored_directory_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "a.md").write_text("a")
    (tmp_path / "node_modules" / "pkg").mkdir(parents=True)
    (tmp_path / "node_modules" / "pkg" / "b.md").write_text("b")
    os.symlink(tmp_path / "nowhere", tmp_path / "node_modules" / "pkg" / "broken.md")
    result = discover(DiscoverConfig(roots=[tmp_path], follow_symlinks=True))
    assert [Path(f.file_path).name for f in result.files] == ["a.md"]
    assert result.failures == []  # not even the broken link below it


@pytest.mark.integration
def test_a_root_holding_ragpipes_own_data_never_indexes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ragpipe ingest .` in a project: the work dir, the store, its published copies, the
    reports and the lock are below the root. They are skip rows, never documents (run 2
    indexed 22 of them, and run 3 stopped: the published copies it indexed were gone)."""
    from ragpipe import checkpoint
    from ragpipe.ingest.pipeline import run_ingest
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.schemas import Skip
    from tests.support.corpora import make_config, stored, topic_doc

    for topic in ("wings", "engines"):
        (tmp_path / f"{topic}.md").write_text(topic_doc(topic), encoding="utf-8")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "report.md").write_text("# A report\n\nrecall 0.9\n", "utf-8")
    monkeypatch.chdir(tmp_path)
    cfg = make_config(Path("."), tmp_path, eval={"reports_dir": tmp_path / "reports"})
    lines = [run_ingest(cfg).line() for _ in range(3)]
    assert lines[0].startswith("seen=2 added=2 ") and "failed=0" in lines[0], lines
    for line in lines[1:]:
        assert line.startswith("seen=2 added=0 changed=0 unchanged=2 removed=0 failed=0"), line
    assert {p["file_path"] for p in stored(cfg).values()} == {"engines.md", "wings.md"}
    skipped = checkpoint.read_records(WorkDir(cfg.paths.work_dir).skipped, Skip)
    own = {s.file_path for s in skipped if s.reason == "ragpipe_data"}
    assert own == {"reports", "store-edge", ".store-edge.published", ".store-edge.ingest.lock",
                   "work-edge"}  # fmt: skip


def test_a_root_that_is_ragpipes_own_data_or_inside_its_index_is_not_walked(
    tmp_path: Path,
) -> None:
    """`roots: [data/work]`: only entries below a root were checked, so such a root was
    walked whole and its checkpoints indexed. A root inside the work dir that is the user's
    (work_dir: data, roots: [data/docs]) is walked, ragpipe's own entries below it skipped."""
    work, store = tmp_path / "data", tmp_path / "store"
    (work / "discover").mkdir(parents=True)
    (work / "discover" / "manifest.json").write_text("{}", "utf-8")
    (work / "docs").mkdir()
    (work / "docs" / "a.md").write_text("# A\n\na document\n", "utf-8")
    (store / "segments").mkdir(parents=True)
    (store / "segments" / "notes.txt").write_text("not a document\n", "utf-8")
    (tmp_path / "lock").write_text("123\n", "utf-8")
    roots = [work, store / "segments", tmp_path / "lock", work / "docs"]
    result = discover(DiscoverConfig(roots=roots), own=[work, store, tmp_path / "lock"],
                      sealed_own=[store])  # fmt: skip
    assert [f.file_path for f in result.files] == [f"{(work / 'docs').as_posix()}/a.md"]
    assert [(s.file_path, s.reason) for s in result.skipped] == [
        (r.as_posix(), "ragpipe_data") for r in roots[:3]
    ]
    assert result.skipped[0].detail.startswith("the root is ragpipe's own work dir")
    assert result.failures == []


@pytest.mark.integration
def test_own_data_by_another_name_or_in_a_local_qdrant_store_is_never_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qdrant-client's local store under the root (its meta.json was indexed: 1 point, then
    3), and, with follow_symlinks, a link by another name to the work dir or into it."""
    from ragpipe import checkpoint
    from ragpipe.ingest.pipeline import run_ingest
    from ragpipe.ingest.runner import WorkDir
    from ragpipe.schemas import Skip
    from tests.support.corpora import make_config, stored, topic_doc

    (tmp_path / "wings.md").write_text(topic_doc("wings"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    cfg = make_config(Path("."), tmp_path, backend="qdrant",
                      discover={"follow_symlinks": True},
                      eval={"reports_dir": tmp_path / "reports"})  # fmt: skip
    assert run_ingest(cfg).added == 1
    os.symlink(tmp_path / "work-qdrant", tmp_path / "w")
    os.symlink(tmp_path / "work-qdrant" / "discover" / "manifest.json", tmp_path / "m.json")
    for _ in range(2):
        line = run_ingest(cfg).line()
        assert line.startswith("seen=1 added=0 changed=0 unchanged=1 removed=0 failed=0"), line
    assert {p["file_path"] for p in stored(cfg).values()} == {"wings.md"}
    skipped = checkpoint.read_records(WorkDir(cfg.paths.work_dir).skipped, Skip)
    own = {s.file_path for s in skipped if s.reason == "ragpipe_data"}
    assert {"store-qdrant", "w", "m.json", "work-qdrant"} <= own

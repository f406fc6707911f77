"""Find the files to ingest under one or more roots, and hash them."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ragpipe import checkpoint
from ragpipe.config import (
    DiscoverConfig,
    RagpipeConfig,
    StoreBackend,
    fingerprint,
    parse_ignore,
)
from ragpipe.globs import glob_regex
from ragpipe.ingest import runner
from ragpipe.ingest.fetch import run_fetch
from ragpipe.schemas import Failure, Skip, SourceFile

logger = logging.getLogger(__name__)

STAGE = "discover"
OWN_DATA = "ragpipe_data"
OWN_DATA_DETAIL = (
    "ragpipe's own work dir, store, reports, lock, golden set or configuration: never indexed"
)
KINDS = {
    "pdf": "pdf",
    "md": "markdown",
    "markdown": "markdown",
    "html": "html",
    "htm": "html",
    "docx": "docx",
    "txt": "text",
    # Docling's model-free backends (ragpipe.ingest.convert.DOCLING_SIMPLE)
    "pptx": "pptx",
    "xlsx": "xlsx",
    "xlsm": "xlsx",
    "odt": "opendocument",
    "ods": "opendocument",
    "odp": "opendocument",
    "epub": "epub",
    "eml": "email",
    "adoc": "asciidoc",
    "asciidoc": "asciidoc",
    "tex": "latex",
    "latex": "latex",
    "vtt": "vtt",
    "csv": "csv",
}


@dataclass
class DiscoverResult:
    """Everything discover saw: files to ingest, failures, deliberate skips."""

    files: list[SourceFile] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)


def is_ignored(rel_path: str, patterns: list[str]) -> bool:
    """Whether a root-relative POSIX path, a file's or a folder's, is ignored (see
    ``IgnoreRules``)."""
    rules = IgnoreRules(patterns)
    return rules.ignores(rel_path) or rules.prunes(rel_path)


def _any_of(regexes: list[re.Pattern[str]]) -> re.Pattern[str] | None:
    joined = "|".join(f"(?:{r.pattern})" for r in regexes)
    return re.compile(joined, re.DOTALL) if regexes else None


class IgnoreRules:
    """``discover.ignore`` compiled once per discovery, like ``.gitignore``
    (``config.parse_ignore``): a pattern without a ``/`` matches a file or folder name at
    any depth, one with a ``/`` inside (or a leading ``/`` or ``./``) the path from the
    root; a trailing ``/`` matches folders only; a folder that matches is left out with
    everything below it; ``dir/**`` matches ``dir`` itself too (``dir/**/`` only the folders
    below it).
    """

    def __init__(self, patterns: list[str]) -> None:
        file_paths: list[re.Pattern[str]] = []
        file_names: list[re.Pattern[str]] = []
        dir_paths: list[re.Pattern[str]] = []
        dir_names: list[re.Pattern[str]] = []
        for pattern in patterns:
            glob, anchored, folders = parse_ignore(pattern)
            if not glob:
                continue
            regex = glob_regex(glob)
            (dir_paths if anchored else dir_names).append(regex)
            if not folders:
                (file_paths if anchored else file_names).append(regex)
            if glob.endswith("/**") and len(glob) > 3 and not folders:
                # dir/** is everything below dir: dir itself need not be walked. Not dir/**/,
                # the folders below dir only (git's reading): files right in dir stay.
                dir_paths.append(glob_regex(glob[:-3]))
        self._file_path = _any_of(file_paths)
        self._file_name = _any_of(file_names)
        self._dir_path = _any_of(dir_paths)
        self._dir_name = _any_of(dir_names)

    def ignores(self, rel_path: str) -> bool:
        """Whether the file (or link) at ``rel_path`` is ignored, itself or as below an
        ignored folder (an object key, a records glob: nothing walked the folders)."""
        if self.ignores_entry(rel_path):
            return True
        folder = rel_path.rpartition("/")[0]
        while folder:
            if self.prunes(folder):
                return True
            folder = folder.rpartition("/")[0]
        return False

    def ignores_entry(self, rel_path: str) -> bool:
        """Whether the file (or link) at ``rel_path`` is ignored by its own path or name
        (the walk has checked its folders already)."""
        if self._file_path is not None and self._file_path.match(rel_path):
            return True
        name = rel_path.rpartition("/")[2]
        return self._file_name is not None and self._file_name.match(name) is not None

    def prunes(self, rel_dir: str) -> bool:
        """Whether the folder ``rel_dir`` is ignored, with everything below it (skip walking
        it)."""
        if self._dir_path is not None and self._dir_path.match(rel_dir):
            return True
        name = rel_dir.rpartition("/")[2]
        return self._dir_name is not None and self._dir_name.match(name) is not None


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file's bytes, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


# Kinds whose lines are checked against discover.max_line_bytes (HTML is often minified).
LINE_CHECKED = frozenset({"markdown", "text", "asciidoc", "latex", "vtt"})


def _digest_and_longest_line(fh: BinaryIO, chunk_size: int = 1 << 20) -> tuple[str, int]:
    """SHA-256 of the rest of ``fh`` and the length of its longest line, in one pass.

    A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (old Mac files; convert reads
    them as line breaks too): split on ``\\n`` only, a 163 KB file with ``\\r`` endings
    was one long line.
    """
    digest = hashlib.sha256()
    longest = run = 0
    while block := fh.read(chunk_size):
        digest.update(block)
        lines = block.replace(b"\r", b"\n")  # only lengths are measured here
        first, _, rest = lines.partition(b"\n")
        if not _:  # no line break in this block: the current line goes on
            run += len(block)
            continue
        longest = max(longest, run + len(first))
        last_nl = rest.rfind(b"\n")
        if last_nl >= 0:
            longest = max(longest, max(map(len, rest[:last_nl].split(b"\n"))))
            run = len(rest) - last_nl - 1
        else:
            run = len(rest)
    return digest.hexdigest(), max(longest, run)


def kind_of(path: str | os.PathLike[str], text_extensions: list[str]) -> str | None:
    """Document kind by extension, or None when the type is not ingested."""
    name = os.fspath(path).rpartition("/")[2].lstrip(".")  # ".bashrc" has no extension
    ext = name.rpartition(".")[2].lower() if "." in name else ""
    if ext in KINDS:
        return KINDS[ext]
    if ext in text_extensions:
        return "text"
    return None


def file_kind(path: str, file_path: str, root: str, config: DiscoverConfig) -> str | None:
    """``records`` for a file a ``discover.records`` rule matches (expanded into its records
    after discovery; no line check: a minified JSON export is one long line), else
    ``kind_of``."""
    if config.records:
        from ragpipe.ingest.records import KIND_FILE, relative_path, rule_for

        if rule_for(relative_path(file_path, root), config.records):
            return KIND_FILE
    return kind_of(path, config.text_extensions)


def _walk(
    root: str,
    rules: IgnoreRules,
    follow: bool,
    on_error: Callable[[OSError, str], None],
    kept_out: Callable[[os.DirEntry[str], str], bool] = lambda entry, rel: False,
) -> Iterator[tuple[os.DirEntry[str], str]]:
    """Depth-first, name-sorted: (entry, root-relative path) of everything but directories.

    Symbolic links to directories are yielded (not entered) unless ``follow``;
    followed directories already visited (a link loop) are not entered again.
    Directories an ignore glob covers entirely are not entered at all, nor those
    ``kept_out(entry, rel)`` names. A directory that cannot be read is passed to
    ``on_error`` with its root-relative path ("" the root).
    """
    seen_dirs: set[tuple[int, int]] = set()
    stack = [(root, "")]
    # Linked directories (followed) after every real one: a folder is walked under its own
    # path, and a link to it ("asub" -> "sub", sorted first) is then a folder already seen.
    linked: list[tuple[str, str]] = []
    while stack or linked:
        dirpath, rel_dir = stack.pop() if stack else linked.pop(0)
        if follow:
            try:
                st = os.stat(dirpath)
            except OSError as exc:
                on_error(exc, rel_dir)
                continue
            if (st.st_dev, st.st_ino) in seen_dirs:
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
        try:
            with os.scandir(dirpath) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            on_error(exc, rel_dir)
            continue
        subdirs: list[tuple[str, str]] = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=follow)
            except OSError:
                is_dir = False
            if not is_dir:
                yield entry, rel
            elif not rules.prunes(rel) and not kept_out(entry, rel):
                (linked if entry.is_symlink() else subdirs).append((entry.path, rel))
        stack.extend(reversed(subdirs))


def discover(
    config: DiscoverConfig,
    roots: list[Path] | None = None,
    progress: Callable[[int], None] | None = None,
    own: Iterable[Path] = (),
    sealed_own: Iterable[Path] = (),
) -> DiscoverResult:
    """Walk the roots, keep ingestible files, hash them.

    Args:
        config: Discovery settings.
        roots: Overrides ``config.roots`` (e.g. paths given on the CLI).
        progress: Called with 1 for each file hashed.
        own: ragpipe's own folders and files (``own_paths``): never walked or indexed
            where a root holds them, each a ``ragpipe_data`` skip row; nor is a root
            that is one of them.
        sealed_own: those of them that hold nothing of the user's (the index's folders):
            a root inside one is a ``ragpipe_data`` skip row too.

    Returns:
        Files sorted by ``file_path``, de-duplicated by real path (a file under
        its own path wins over one reached through a link, then the first root),
        plus failure rows (unreadable, too large, broken link) and skips
        (symlinks when not followed or to a file indexed already, unsupported
        types, ragpipe's own data).
    """
    result = DiscoverResult()
    seen_real: dict[str, str] = {}  # real path -> the path it is indexed under
    linked: list[tuple[str, str, str, str]] = []
    walked: set[str] = set()  # file paths handled under an earlier root
    broken_links: set[str] = set()  # real locations of the broken links said
    linked_broken: list[tuple[str, Failure]] = []  # broken links reached through a folder link
    rules = IgnoreRules(config.ignore)
    own_real = {os.path.realpath(p) for p in own}
    own_names = {os.path.basename(p) for p in own_real}  # a cheap test before realpath
    own_dirs = tuple(p + os.sep for p in own_real)
    sealed = tuple(p + os.sep for p in (os.path.realpath(p) for p in sealed_own))
    all_roots = roots or config.roots
    for root in all_roots:
        root_label = PurePosixPath(os.path.normpath(root).replace(os.sep, "/")).as_posix()
        if not root.exists():
            result.failures.append(
                Failure(root_label, STAGE, "missing_root", f"root {root} does not exist")
            )
            continue
        real_root = os.path.realpath(root)
        # roots: [data/work], or a folder of the index: all ragpipe's. A root inside the
        # work dir or the reports (work_dir: data, roots: [data/docs]) may be the user's:
        # walked, with ragpipe's own entries below it skipped as under any root.
        if real_root in own_real or real_root.startswith(sealed):
            result.skipped.append(Skip(root_label, OWN_DATA, f"the root is {OWN_DATA_DETAIL}"))
            continue
        if root.is_file():
            # Named as a root, it is indexed whatever discover.ignore says: the globs match
            # below a root, and a folder root is walked whatever its name (a file root
            # that matched vanished without a row).
            real = os.path.realpath(root)
            _consider(str(root), root_label, root_label, real, config, result, seen_real, progress)
            continue

        def on_error(exc: OSError, rel_dir: str, label: str = root_label) -> None:
            # Named as the files below it are (the plan keeps those indexed: a directory
            # that cannot be read this run is not a directory that was deleted).
            where = (rel_dir or label) if label == "." else f"{label}/{rel_dir}".rstrip("/")
            result.failures.append(Failure(where, STAGE, "unreadable", exc.strerror or str(exc)))

        # Without following links every directory below the root is a real one.
        follow = config.follow_symlinks
        prefix = f"{root_label}/" if root_label != "." else ""

        def kept_out(
            entry: os.DirEntry[str], rel: str, prefix: str = prefix, follow: bool = follow
        ) -> bool:
            """ragpipe's own data below a root (``ingest .``): its work dir, its store and
            the store's published copies, its reports, its locks; followed links too, by
            whatever name, to them or into them."""
            linked = follow and entry.is_symlink()
            if entry.name not in own_names and not linked:
                return False
            real = os.path.realpath(entry.path)
            if real not in own_real and not (linked and real.startswith(own_dirs)):
                return False
            result.skipped.append(Skip(prefix + rel, OWN_DATA, OWN_DATA_DETAIL))
            return True

        for entry, rel in _walk(str(root), rules, follow, on_error, kept_out):
            if rules.ignores_entry(rel) or kept_out(entry, rel):
                continue
            file_path = prefix + rel
            if len(all_roots) > 1:  # under an earlier root too (roots: [docs, docs/sub])
                if file_path in walked:
                    continue
                walked.add(file_path)
            if not _is_utf8(file_path):
                result.failures.append(_bad_name(file_path))
                continue
            if entry.is_symlink():
                if not follow:
                    result.skipped.append(
                        Skip(file_path, "symlink", "discover.follow_symlinks is off")
                    )
                    continue
                broken = _broken_link(entry.path, file_path)
                if broken is not None:
                    # The link itself, wherever it was reached from: a folder link into a
                    # folder another root walks reached it again under a second path.
                    at = os.path.join(os.path.realpath(os.path.dirname(entry.path)), entry.name)
                    if at == os.path.join(real_root, rel):  # under its own path: said now
                        if at not in broken_links:
                            broken_links.add(at)
                            result.failures.append(broken)
                    else:
                        linked_broken.append((at, broken))
                    continue
                if os.path.isdir(entry.path):
                    continue  # a link to a directory already walked (a loop)
            # Only regular files are opened: a FIFO or device would block or never end.
            # (For a plain entry the type comes from the directory listing: no stat call.)
            if not entry.is_file():
                result.skipped.append(Skip(file_path, "not_a_file", "not a regular file"))
                continue
            real = os.path.realpath(entry.path) if follow else f"{real_root}/{rel}"
            if follow and real != os.path.join(real_root, rel):  # reached through a link
                linked.append((entry.path, file_path, root_label, real))
                continue
            _consider(entry.path, file_path, root_label, real, config, result, seen_real, progress)
    # Files reached through a link come last: a file under its own path (anywhere in the
    # roots) keeps that path, whatever sorts first ("0link.md" or "asub/" used to take the
    # place of the real a.md and sub/), and the link is a skip row that names it.
    for path, file_path, root_label, real in linked:
        if real in seen_real:
            result.skipped.append(Skip(file_path, "same_file", f"a link to {seen_real[real]}"))
            continue
        _consider(path, file_path, root_label, real, config, result, seen_real, progress)
    for at, broken in linked_broken:  # a broken link under its own path was said as that
        if at not in broken_links:
            broken_links.add(at)
            result.failures.append(broken)
    # Overlapping roots meet the same folders (an unreadable one, ragpipe's own data): once.
    result.failures = list(dict.fromkeys(result.failures))
    result.skipped = list(dict.fromkeys(result.skipped))
    result.files.sort(key=lambda f: f.file_path)
    if config.dedupe_content:
        skip_duplicate_content(result)
    logger.info(
        "discover: %d files, %d failed, %d skipped",
        len(result.files),
        len(result.failures),
        len(result.skipped),
    )
    return result


def _broken_link(path: str, file_path: str) -> Failure | None:
    """The failure row of a followed symbolic link that leads to nothing (its target is
    missing, or links lead back to it), else None."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Failure(
                file_path,
                STAGE,
                "broken_link",
                f"symlink loop: {_link_chain(path)} never reaches a file or folder",
            )
        try:
            target = os.readlink(path)
        except OSError:  # gone or replaced since the listing
            target = "?"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return Failure(file_path, STAGE, "broken_link", f"symlink target {target} missing")
        return Failure(
            file_path,
            STAGE,
            "broken_link",
            f"symlink target {target} cannot be reached: {exc.strerror or exc}",
        )
    return None


def _link_chain(path: str, most: int = 8) -> str:
    """``loopA -> loopB -> loopA``: the link's name, then each link's target as written,
    up to the first one met again (or ``most`` of them)."""
    steps = [os.path.basename(path)]
    met = {os.path.abspath(path)}
    current = path
    for _ in range(most):
        try:
            target = os.readlink(current)
        except OSError:  # a folder on the way is a link: the kernel's count ends it
            break
        steps.append(target)
        current = os.path.abspath(os.path.join(os.path.dirname(current), target))
        if current in met:
            break
        met.add(current)
    else:
        steps.append("...")
    return " -> ".join(steps)


def _is_utf8(path: str) -> bool:
    """False for a name whose bytes are not UTF-8 (Python keeps them as lone surrogates)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bad_name(path: str) -> Failure:
    """A failure row for a file whose name is not UTF-8, named so that it can be stored."""
    raw = os.fsencode(path)
    return Failure(
        path,  # stored escaped, as every failure row (schemas.storable)
        STAGE,
        "bad_name",
        f"the file name is not valid UTF-8 (bytes {raw!r}); paths are stored as UTF-8, so "
        "rename it, e.g. `convmv -f latin1 -t utf-8 --notest FILE`",
    )


def skip_duplicate_content(result: DiscoverResult, redirected: Collection[str] = ()) -> None:
    """Keep one file of each content, the first in path order; skip the other copies.

    A web page that ``redirected`` to another URL gives way to a copy that did not: with
    /a-old-guide (301 to /guide) and /guide both listed, /guide was the skip row and its
    text was indexed under the alias, every citation pointing at the redirect.

    ``result.files`` must be sorted by ``file_path``.
    """
    keep: dict[str, str] = {}  # sha256 -> the file_path its content is indexed under
    for f in result.files:
        if f.kind == "record" or not f.size_bytes:  # equal records are two; empty files
            continue
        held = keep.setdefault(f.sha256, f.file_path)
        if held in redirected and f.file_path not in redirected:
            keep[f.sha256] = f.file_path
    kept: list[SourceFile] = []
    for f in result.files:
        original = keep.get(f.sha256) if f.kind != "record" and f.size_bytes else None
        if original is None or original == f.file_path:
            kept.append(f)
        else:
            result.skipped.append(
                Skip(f.file_path, "duplicate_content", f"same bytes as {original}")
            )
    result.files = kept


def _consider(
    path: str,
    file_path: str,
    root_label: str,
    real: str,
    config: DiscoverConfig,
    result: DiscoverResult,
    seen_real: dict[str, str],
    progress: Callable[[int], None] | None,
) -> None:
    """Hash one file (``real``: its resolved path, for de-duplication across roots)."""
    kind = file_kind(path, file_path, root_label, config)
    if kind is None:
        ext = os.path.splitext(path)[1]
        result.skipped.append(Skip(file_path, "unsupported_type", ext or "no extension"))
        return
    if real in seen_real:
        return
    seen_real[real] = file_path
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > config.max_file_bytes:
                result.failures.append(
                    Failure(
                        file_path,
                        STAGE,
                        "too_large",
                        f"{size} bytes exceeds discover.max_file_bytes={config.max_file_bytes}; "
                        "a version indexed before stays searchable until the file is added to "
                        "discover.ignore (or fits again)",
                    )
                )
                return
            if kind in LINE_CHECKED and config.max_line_bytes:
                digest, longest = _digest_and_longest_line(fh)
                if longest > config.max_line_bytes:
                    result.failures.append(
                        Failure(
                            file_path,
                            STAGE,
                            "long_line",
                            f"a line of {longest} bytes (discover.max_line_bytes="
                            f"{config.max_line_bytes}): minified or generated data, not text to "
                            "search? Raise discover.max_line_bytes (0: no limit) to index it "
                            "anyway, or add it to discover.ignore (which also removes a version "
                            "indexed before; until then it stays searchable).",
                            digest,
                        )
                    )
                    return
            else:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        result.failures.append(Failure(file_path, STAGE, "unreadable", exc.strerror or str(exc)))
        return
    result.files.append(SourceFile(file_path, real, root_label, kind, size, digest))
    if progress is not None:
        progress(1)


# -- discover ------------------------------------------------------------------------


@dataclass
class DiscoverCounts(runner.Counts):
    """Files found (``seen``), left out on purpose, failed; the web fetch's counts."""

    seen: int = 0
    failed: int = 0
    skipped: int = 0
    pages: int = field(default=0, metadata={"optional": True})
    pages_not_modified: int = field(default=0, metadata={"optional": True})
    pages_downloaded: int = field(default=0, metadata={"optional": True})
    requests: int = field(default=0, metadata={"optional": True})
    objects_listed: int = field(default=0, metadata={"optional": True})
    objects_downloaded: int = field(default=0, metadata={"optional": True})
    records: int = field(default=0, metadata={"optional": True})
    records_files_parsed: int = field(default=0, metadata={"optional": True})


def index_paths(config: RagpipeConfig) -> list[Path]:
    """The folders of the index itself (``own_paths``' Edge store and published versions,
    or qdrant-client's local store): nothing of the user's is ever inside them."""
    from ragpipe.store import published

    if config.store.backend == StoreBackend.EDGE:
        return [config.store.path, published.root(config.store.path)]
    if config.store.url is None and str(config.store.path) != ":memory:":
        return [config.store.path]
    return []


def own_paths(config: RagpipeConfig) -> list[Path]:
    """What ragpipe writes or reads for this config, which a root may hold (``ragpipe ingest
    .``): the work dir, the Edge store with its published versions and reader copies, the
    reports, and the locks; indexing them would index the index (and fail the next run, as
    the published copies it indexed are tidied away). Also the golden sets and labels (their
    expected answers in the index would flatter every evaluation) and a ``golden`` folder
    holding them or ``eval/golden`` (drafts, held-out sets), the configuration file
    and the ``prefect.yaml`` beside it (``ragpipe init``'s project is often its own root).

    These are paths, not ignore globs: a glob applies to every root, so ``eval/**`` for the
    project dropped another root's own eval/ folder unsaid."""
    from ragpipe.locking import lock_path

    evaluation = [config.eval.golden, *([config.eval.labels] if config.eval.labels else [])]
    if config.index.gate is not None:
        evaluation.extend(config.index.gate.golden)
    # Their folder too, when it is one of golden sets (eval/golden, as init lays it out and
    # `golden draft` writes its drafts): a draft's or a held-out set's questions and
    # answers were indexed, as only the configured sets were left out.
    folders = [g.parent for g in evaluation if g.parent.name == "golden"]
    evaluation += [Path("eval/golden"), *folders]
    project = [config.config_file, config.config_file.parent / "prefect.yaml"] if (
        config.config_file is not None) else []  # fmt: skip
    return [config.paths.work_dir, config.eval.reports_dir, lock_path(config),
            *index_paths(config), *evaluation, *project]  # fmt: skip


def run_discover(
    config: RagpipeConfig, roots: list[Path] | None = None
) -> runner.StageSummary[DiscoverCounts]:
    """Find and hash files, list object storage, fetch web pages; always runs (it is how
    changes are seen)."""
    from ragpipe.ingest.objects import check_packages, run_objects
    from ragpipe.ingest.records import run_records

    check_packages(config.discover.object_roots)  # before any work, not after the walk

    started = time.perf_counter()
    here = runner.WorkDir.of(config).stage("discover")
    corpus = [*(roots if roots is not None else config.discover.roots), *index_paths(config)]
    stale = checkpoint.remove_stale_temps(config.paths.work_dir, not_ours=corpus)
    if stale:
        logger.warning("removed %d temp files left by an interrupted run", stale)
    result = discover(config.discover, roots, own=own_paths(config), sealed_own=index_paths(config))
    stored = run_objects(config, config.discover.object_roots)
    web = run_fetch(config)
    for other in (stored, web):
        result.failures.extend(other.failures)
        result.skipped.extend(other.skipped)
    if web.files or stored.files:
        result.files = sorted([*result.files, *stored.files, *web.files], key=lambda f: f.file_path)
    records = run_records(config, result.files)
    result.files = records.files
    result.failures.extend(records.failures)
    result.skipped.extend(records.skipped)
    if (web.files or stored.files or records.records) and config.discover.dedupe_content:
        # a copy in a bucket, a page that redirects to another listed one, equal records
        skip_duplicate_content(result, web.redirected())
    roots_used = [str(r) for r in (roots or config.discover.roots)]
    config_fp = checkpoint.combine_fingerprints(
        [fingerprint(config.discover, "1"), json.dumps(roots_used)]
    )
    counts = DiscoverCounts(len(result.files), len(result.failures), len(result.skipped))
    if web.requests or web.pages:
        counts.pages = len(web.files)
        counts.pages_not_modified = web.not_modified
        counts.pages_downloaded = web.downloaded
        counts.requests = web.requests
    counts.records = len(records.records)
    counts.records_files_parsed = records.parsed
    if config.discover.object_roots:
        counts.objects_listed = stored.listed
        counts.objects_downloaded = stored.downloaded
    return runner.finish_stage(
        here,
        "discover",
        config_fp,
        "",
        {
            "files": (result.files, SourceFile),
            "failures": (result.failures, Failure),
            "skipped": (result.skipped, Skip),
        },
        counts,
        started,
    )

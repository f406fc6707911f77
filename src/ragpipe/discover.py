"""Find the files to ingest under one or more roots, and hash them."""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath

from ragpipe.config import DiscoverConfig
from ragpipe.schemas import Failure, Skip, SourceFile

logger = logging.getLogger(__name__)

STAGE = "discover"
KINDS = {
    "pdf": "pdf",
    "md": "markdown",
    "markdown": "markdown",
    "html": "html",
    "htm": "html",
    "docx": "docx",
    "txt": "text",
}


@dataclass
class DiscoverResult:
    """Everything discover saw: files to ingest, failures, deliberate skips."""

    files: list[SourceFile] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Translate a glob where ``**`` spans directories and ``*`` does not."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(pattern[i]))
                i += 1
            else:
                out.append(fnmatch.translate(pattern[i : end + 1])[4:-3])
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def is_ignored(rel_path: str, patterns: list[str]) -> bool:
    """Whether a root-relative POSIX path matches any ignore glob.

    ``dir/**`` matches everything below ``dir`` (and ``dir`` itself);
    ``**/name`` matches ``name`` at any depth; a pattern without a slash
    matches the file name at any depth (like ``.gitignore``).
    """
    name = PurePosixPath(rel_path).name
    for pattern in patterns:
        pat = pattern.strip().lstrip("/")
        if not pat:
            continue
        if pat.endswith("/**") and (rel_path == pat[:-3] or _glob_regex(pat).match(rel_path)):
            return True
        if "/" not in pat and _glob_regex(pat).match(name):
            return True
        if _glob_regex(pat).match(rel_path):
            return True
    return False


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file's bytes, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def kind_of(path: Path, text_extensions: list[str]) -> str | None:
    """Document kind by extension, or None when the type is not ingested."""
    ext = path.suffix.lower().lstrip(".")
    if ext in KINDS:
        return KINDS[ext]
    if ext in text_extensions:
        return "text"
    return None


def _walk(root: Path, follow: bool, on_error: Callable[[OSError], None]) -> Iterator[Path]:
    seen_dirs: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=follow, onerror=on_error):
        if follow:
            try:
                st = os.stat(dirpath)
            except OSError:
                dirnames[:] = []
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen_dirs:  # a symlink loop: do not descend again
                dirnames[:] = []
                continue
            seen_dirs.add(key)
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name
        if not follow:
            for name in dirnames:
                if (Path(dirpath) / name).is_symlink():
                    yield Path(dirpath) / name


def discover(
    config: DiscoverConfig,
    roots: list[Path] | None = None,
    progress: Callable[[int], None] | None = None,
) -> DiscoverResult:
    """Walk the roots, keep ingestible files, hash them.

    Args:
        config: Discovery settings.
        roots: Overrides ``config.roots`` (e.g. paths given on the CLI).
        progress: Called with 1 for each file hashed.

    Returns:
        Files sorted by ``file_path``, de-duplicated by real path (first root
        wins), plus failure rows (unreadable, too large, broken link) and
        skips (symlinks when not followed, unsupported types).
    """
    result = DiscoverResult()
    seen_real: set[str] = set()
    for root in roots or config.roots:
        root_label = PurePosixPath(os.path.normpath(root).replace(os.sep, "/")).as_posix()
        if not root.exists():
            result.failures.append(
                Failure(root_label, STAGE, "missing_root", f"root {root} does not exist")
            )
            continue

        def on_error(exc: OSError, label: str = root_label) -> None:
            result.failures.append(
                Failure(exc.filename or label, STAGE, "unreadable", exc.strerror or str(exc))
            )

        candidates = [root] if root.is_file() else _walk(root, config.follow_symlinks, on_error)
        for path in candidates:
            if root.is_file():
                rel = path.name
                file_path = root_label
            else:
                rel = path.relative_to(root).as_posix()
                file_path = f"{root_label}/{rel}" if root_label != "." else rel
            if is_ignored(rel, config.ignore):
                continue
            _consider(path, file_path, root_label, config, result, seen_real, progress)
    result.files.sort(key=lambda f: f.file_path)
    logger.info(
        "discover: %d files, %d failed, %d skipped",
        len(result.files),
        len(result.failures),
        len(result.skipped),
    )
    return result


def _consider(
    path: Path,
    file_path: str,
    root_label: str,
    config: DiscoverConfig,
    result: DiscoverResult,
    seen_real: set[str],
    progress: Callable[[int], None] | None,
) -> None:
    if path.is_symlink():
        if not config.follow_symlinks:
            result.skipped.append(Skip(file_path, "symlink", "discover.follow_symlinks is off"))
            return
        if not path.exists():
            result.failures.append(
                Failure(
                    file_path, STAGE, "broken_link", f"symlink target {os.readlink(path)} missing"
                )
            )
            return
        if path.is_dir():
            return  # os.walk(followlinks=True) descends into it
    kind = kind_of(path, config.text_extensions)
    if kind is None:
        result.skipped.append(Skip(file_path, "unsupported_type", path.suffix or "no extension"))
        return
    real = os.path.realpath(path)
    if real in seen_real:
        return
    seen_real.add(real)
    try:
        size = path.stat().st_size
        if size > config.max_file_bytes:
            result.failures.append(
                Failure(
                    file_path,
                    STAGE,
                    "too_large",
                    f"{size} bytes exceeds discover.max_file_bytes={config.max_file_bytes}",
                )
            )
            return
        digest = sha256_file(path)
    except OSError as exc:
        result.failures.append(Failure(file_path, STAGE, "unreadable", exc.strerror or str(exc)))
        return
    result.files.append(SourceFile(file_path, str(Path(real)), root_label, kind, size, digest))
    if progress is not None:
        progress(1)

"""Object-storage roots (``s3://bucket/prefix``, ``gs://…``, ``az://…``): listed and read
through fsspec, downloaded into the work dir only when they changed.

* An object's version is the store's own (ETag on S3 and Azure, generation on GCS) plus its
  size, taken from the listing. A key whose version is the one the last run saw keeps its
  hash and body: an unchanged night costs one paginated listing and a compare.
* A changed or new object is downloaded to ``objects/bodies`` (streamed, hashed on the way,
  renamed into place when whole) and then goes through convert like a file; it is indexed
  under its URL.
* A listing that fails for a reason that may pass (timeout, 5xx, dropped connection) is
  retried with backoff, then the root gets an ``unavailable`` failure row and the plan keeps
  every indexed object below it: nothing is deleted because a server was down. A bucket that
  does not exist is a ``missing_root``, like a folder that is gone, and the plan keeps its
  objects indexed too (a root taken out of the config is what removes them).
* Credentials come from the protocol's own environment or a Prefect Secret block
  (``object_storage.credentials_block``); they are never part of the config or the logs.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ragpipe import checkpoint
from ragpipe.config import OBJECT_SCHEMES, ObjectStorageConfig, RagpipeConfig, read_secret_block
from ragpipe.errors import ConfigError
from ragpipe.ingest.discover import (
    LINE_CHECKED,
    STAGE,
    IgnoreRules,
    _digest_and_longest_line,
    file_kind,
)
from ragpipe.ingest.runner import WorkDir
from ragpipe.progress import Reporter, reporter
from ragpipe.schemas import Failure, Skip, SourceFile, StoredObject

logger = logging.getLogger(__name__)

# Failure categories of a root that could not be listed: the plan deletes nothing below it.
UNAVAILABLE = "unavailable"
HOLDING_CATEGORIES = frozenset({UNAVAILABLE, "forbidden", "no_credentials"})
# The pip extra that installs each protocol's fsspec package.
EXTRAS = {"s3fs": "s3", "gcsfs": "gcs", "adlfs": "azure"}
DOWNLOAD_THREADS = 8
BLOCK = 1 << 20
WHOLE_BYTES = 16 << 20  # objects up to this size are read in one request
BACKOFF_S = 0.25

T = TypeVar("T")
# botocore's "no credentials at all" errors, by name (botocore is s3fs's, not ragpipe's).
_NO_CREDENTIALS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
)


@dataclass
class ObjectsResult:
    """What the object roots hold now, and what the listing cost."""

    files: list[SourceFile] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    objects: list[StoredObject] = field(default_factory=list)
    listed: int = 0
    downloaded: int = 0


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (``s3``, ``bucket/prefix``)."""
    scheme, _, rest = url.partition("://")
    return scheme.lower(), rest.strip("/")


def open_filesystem(scheme: str, config: ObjectStorageConfig) -> Any:
    """The fsspec filesystem of ``scheme`` under the configured options and credentials.

    Raises:
        ConfigError: The protocol's package is not installed, or the credentials block cannot
            be read or is not a JSON object.
    """
    check_packages([f"{scheme}://"])
    package = OBJECT_SCHEMES[scheme]
    import fsspec

    options: dict[str, Any] = dict(config.options)
    if config.credentials_block is not None:
        options.update(_credentials(config.credentials_block))
    if package == "s3fs":
        if config.endpoint_url:
            options["endpoint_url"] = config.endpoint_url
        # ragpipe counts the retries (object_storage.retries); botocore makes one attempt.
        options["config_kwargs"] = {
            "connect_timeout": config.timeout_s,
            "read_timeout": config.timeout_s,
            "retries": {"total_max_attempts": 1},
            **options.get("config_kwargs", {}),
        }
    try:
        fs = fsspec.filesystem(scheme, skip_instance_cache=True, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"object_storage.options: {package} does not take these options for {scheme}:// "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if hasattr(fs, "retries"):
        fs.retries = 1  # s3fs's own retry loop would multiply ours
    return fs


def _credentials(block: str) -> dict[str, Any]:
    raw = read_secret_block("object_storage.credentials_block", block, "the protocol's credentials")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(
            f"object_storage.credentials_block: the Prefect Secret block {block!r} must hold "
            'a JSON object of storage options, e.g. {"key": "...", "secret": "..."} for s3'
        )
    return value


def object_version(info: dict[str, Any]) -> str:
    """The store's version of an object from its listing entry ('' when it gives none)."""
    for name in ("generation", "ETag", "etag", "version_id", "VersionId"):
        value = info.get(name)
        if value:
            return str(value).strip('"')
    return ""


class _TooLarge(Exception):
    """The object grew past discover.max_file_bytes after it was listed."""


def _retrying(call: Callable[[], T], retries: int, what: str) -> T:
    """``call()``, retried with exponential backoff for errors that may pass (an object
    grown too large does not shrink: it was downloaded ``retries + 1`` times)."""
    for attempt in range(retries + 1):
        try:
            return call()
        except (FileNotFoundError, PermissionError, ConfigError, _TooLarge):
            raise
        except Exception as exc:
            if attempt == retries or type(exc).__name__ in _NO_CREDENTIALS:
                raise
            delay = BACKOFF_S * 2**attempt
            logger.warning("%s failed (%s); retrying in %.2f s", what, _reason(exc), delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def body_path(bodies: Path, url: str, sha256: str) -> Path:
    """Where one version of an object is kept: named by URL and content (and the key's
    extension, which Docling reads the format from)."""
    key = hashlib.sha256(url.encode()).hexdigest()[:24]
    suffix = Path(url.rpartition("/")[2]).suffix.lower()
    return bodies / f"{key}-{sha256[:16]}{suffix}"


@dataclass(frozen=True)
class _Downloaded:
    sha256: str
    path: Path
    size: int
    longest_line: int


def _download(fs: Any, key: str, url: str, size: int, bodies: Path, limit: int) -> _Downloaded:
    """Write one object into ``bodies`` (hashed on the way).

    An object up to ``WHOLE_BYTES`` is read in one request; a larger one is streamed, and
    given up past ``limit`` bytes (it grew since the listing).
    """
    bodies.mkdir(parents=True, exist_ok=True)
    temp = bodies / f".{hashlib.sha256(url.encode()).hexdigest()[:24]}.{os.getpid()}.part"
    try:
        with temp.open("wb") as out:
            if size <= WHOLE_BYTES:
                data = fs.cat_file(key)
                if len(data) > limit:
                    raise _TooLarge(len(data))
                out.write(data)
            else:
                with fs.open(key, "rb", block_size=BLOCK) as src:
                    while block := src.read(BLOCK):
                        out.write(block)
                        if out.tell() > limit:
                            raise _TooLarge(out.tell())
            out.flush()
            os.fsync(out.fileno())
            written = out.tell()
        with temp.open("rb") as fh:
            sha, longest = _digest_and_longest_line(fh)
        path = body_path(bodies, url, sha)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return _Downloaded(sha, path, written, longest)


def _have_body(known: StoredObject | None, version: str, size: int) -> bool:
    return (
        known is not None
        and bool(version)
        and known.version == version
        and known.size_bytes == size
        and Path(known.body_path).is_file()
    )


def list_objects(
    config: RagpipeConfig,
    roots: Iterable[str],
    previous: list[StoredObject],
    bodies: Path,
    progress: Reporter | None = None,
) -> ObjectsResult:
    """List every root, download what changed, and say what each root holds now.

    Args:
        config: The run's configuration (discover and object_storage sections).
        roots: Object-storage URLs (``discover.object_roots``).
        previous: The state the last run saved (what it listed and downloaded).
        bodies: Where downloaded objects are kept.
        progress: Told of the downloads (one count per object).
    """
    result = ObjectsResult()
    storage = config.object_storage
    rules = IgnoreRules(config.discover.ignore)
    known = {o.url: o for o in previous}
    seen: set[str] = set()  # a key under two overlapping roots is the first root's
    systems = {scheme: open_filesystem(scheme, storage) for scheme in _schemes(roots)}
    for root in roots:
        scheme, path = split_url(root)
        fs = systems[scheme]
        try:
            listing: dict[str, dict[str, Any]] = _retrying(
                partial(fs.find, path, detail=True), storage.retries, f"listing {root}"
            )
        except FileNotFoundError as exc:
            result.failures.append(Failure(root, STAGE, "missing_root", _reason(exc)))
            continue
        except Exception as exc:
            category = _holding_category(exc)
            tried = f" after {storage.retries} retries" if category == UNAVAILABLE else ""
            result.failures.append(
                Failure(
                    root,
                    STAGE,
                    category,
                    f"cannot list {root} ({_reason(exc)}){tried}; nothing indexed below it is "
                    "deleted this run" + _FIXES.get(category, ""),
                )
            )
            below = f"{root}/"
            result.objects.extend(
                o for o in previous if o.url.startswith(below) and o.url not in seen
            )
            seen.update(o.url for o in previous if o.url.startswith(below))
            continue
        todo: list[tuple[str, str, str, int, str]] = []
        for key in sorted(listing):
            info = listing[key]
            if key.endswith("/") or info.get("type") == "directory":
                continue  # a folder marker
            url = f"{scheme}://{key}"
            if url in seen:
                continue
            seen.add(url)
            result.listed += 1
            rel = key[len(path) :].lstrip("/") if key.startswith(path) else key
            if rel and rules.ignores(rel):  # "": the root is this key, named: indexed
                continue
            kind = file_kind(key, url, root, config.discover)
            if kind is None:
                ext = os.path.splitext(key)[1]
                result.skipped.append(Skip(url, "unsupported_type", ext or "no extension"))
                continue
            if "?versionId=" in key:  # fsspec reads it as a version, not as part of the key
                result.skipped.append(
                    Skip(url, "unreadable_key", "fsspec cannot read a key holding '?versionId='")
                )
                continue
            size = int(info.get("size") or 0)
            if size > config.discover.max_file_bytes:
                result.failures.append(_too_large(url, size, config))
                continue
            version = object_version(info)
            before = known.get(url)
            if _have_body(before, version, size):
                assert before is not None
                # Under this root now: a root widened (s3://bkt/kb to s3://bkt) kept the old
                # one, and discover.records globs, relative to it, stopped matching.
                kept = replace(before, root=root)
                result.objects.append(kept)
                _accept(result, kept, kind, config)
            else:
                todo.append((key, url, kind, size, version))
        _download_all(fs, root, todo, bodies, result, config, progress)
    result.files.sort(key=lambda f: f.file_path)
    result.objects.sort(key=lambda o: o.url)
    return result


# What to do about a root that could not be listed, by failure category.
_FIXES = {
    "forbidden": "; give the credentials read access (s3:ListBucket and s3:GetObject on S3)",
    "no_credentials": "; set the protocol's credentials in the environment or name a Prefect "
    "Secret block in object_storage.credentials_block",
}


def _holding_category(exc: BaseException) -> str:
    """``forbidden``, ``no_credentials`` (neither passes by retrying) or ``unavailable``."""
    if isinstance(exc, PermissionError):
        return "forbidden"
    if type(exc).__name__ in _NO_CREDENTIALS:
        return "no_credentials"
    return UNAVAILABLE


def _too_large(url: str, size: int, config: RagpipeConfig) -> Failure:
    limit = config.discover.max_file_bytes
    return Failure(url, STAGE, "too_large", f"{size} bytes exceeds discover.max_file_bytes={limit}")


def _schemes(roots: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(split_url(root)[0] for root in roots))


def check_packages(roots: Iterable[str]) -> None:
    """Raise before any work when a root's protocol package is not installed.

    Raises:
        ConfigError: Names the package and the pip extra that installs it.
    """
    for scheme in _schemes(roots):
        package = OBJECT_SCHEMES[scheme]
        try:
            importlib.import_module(package)
        except ImportError as exc:
            raise ConfigError(
                f"discover.object_roots: {scheme}:// needs the {package} package; install it "
                f"with `pip install 'ragpipe[{EXTRAS[package]}]'` (or `pip install {package}`)"
            ) from exc


def _download_all(
    fs: Any,
    root: str,
    todo: list[tuple[str, str, str, int, str]],
    bodies: Path,
    result: ObjectsResult,
    config: RagpipeConfig,
    progress: Reporter | None,
) -> None:
    """Download the new and changed objects of one root, several at a time."""
    if not todo:
        return
    retries = config.object_storage.retries

    limit = config.discover.max_file_bytes

    def fetch(item: tuple[str, str, str, int, str]) -> _Downloaded | BaseException:
        key, url, _, size, _ = item
        try:
            return _retrying(partial(_download, fs, key, url, size, bodies, limit), retries, url)
        except Exception as exc:
            return exc

    if progress is not None:
        progress.start(f"download {root}", len(todo))
    try:
        with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
            outcomes = []
            for outcome in pool.map(fetch, todo):
                outcomes.append(outcome)
                if progress is not None:
                    progress.advance(1)
    finally:
        if progress is not None:
            progress.finish()
    checkpoint.fsync_dir(bodies)  # the renamed bodies are durable before the state names them
    for (_, url, kind, _, version), outcome in zip(todo, outcomes, strict=True):
        if isinstance(outcome, _TooLarge):
            result.failures.append(_too_large(url, int(outcome.args[0]), config))
        elif isinstance(outcome, FileNotFoundError):
            result.failures.append(
                Failure(
                    url,
                    STAGE,
                    "vanished",
                    f"listed, then not found when downloaded ({_reason(outcome)}): deleted since "
                    "the listing? Its indexed version stays until a run no longer lists it",
                )
            )
        elif isinstance(outcome, BaseException):
            result.failures.append(
                Failure(url, STAGE, "unreadable", f"download failed: {_reason(outcome)}")
            )
        else:
            stored = StoredObject(
                url, root, version, outcome.size, outcome.sha256, str(outcome.path),
                outcome.longest_line,
            )  # fmt: skip
            result.objects.append(stored)
            result.downloaded += 1
            _accept(result, stored, kind, config)


def _accept(result: ObjectsResult, obj: StoredObject, kind: str, config: RagpipeConfig) -> None:
    """Hand a downloaded object on as a source file, after discover's own checks (the longest
    line was measured when it was downloaded: an unchanged night reads no body)."""
    limit = config.discover.max_line_bytes
    if kind in LINE_CHECKED and limit:
        longest = obj.longest_line
        if longest > limit:
            result.failures.append(
                Failure(
                    obj.url,
                    STAGE,
                    "long_line",
                    f"a line of {longest} bytes (discover.max_line_bytes={limit}); raise it "
                    "(0: no limit) or add the key to discover.ignore",
                    obj.sha256,
                )
            )
            return
    result.files.append(
        SourceFile(obj.url, obj.body_path, obj.root, kind, obj.size_bytes, obj.sha256)
    )


def saved_objects(config: RagpipeConfig) -> list[StoredObject]:
    """The object state the last run saved ([] when none or unreadable)."""
    return checkpoint.read_state(
        WorkDir.of(config).objects_state, StoredObject, "downloading every object"
    )


def run_objects(config: RagpipeConfig, roots: list[str]) -> ObjectsResult:
    """List ``roots``, download what changed, then save the state and prune old bodies.

    The state is written after every body it names, so it never points at a body that is
    not on disk.
    """
    work = WorkDir.of(config)
    previous = saved_objects(config)
    if not roots:
        if previous:  # object roots were removed from the config: forget them
            checkpoint.write_records(work.objects_state, [], StoredObject)
            _prune(work.objects_bodies, [])
        return ObjectsResult()
    result = list_objects(config, roots, previous, work.objects_bodies, reporter())
    checkpoint.write_records(work.objects_state, result.objects, StoredObject)
    _prune(work.objects_bodies, result.objects)
    logger.info(
        "objects: %d listed under %d roots, %d downloaded, %d failed",
        result.listed,
        len(roots),
        result.downloaded,
        len(result.failures),
    )
    return result


def _prune(bodies: Path, keep: list[StoredObject]) -> None:
    """Delete bodies no object in the state names (and partial downloads)."""
    if not bodies.is_dir():
        return
    wanted = {Path(o.body_path).name for o in keep}
    for entry in bodies.iterdir():
        if entry.is_file() and entry.name not in wanted:
            entry.unlink(missing_ok=True)

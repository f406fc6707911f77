"""A GGUF model's own tokenizer, rebuilt from the vocabulary stored in its file.

xllamacpp runs llama.cpp's server core in-process but exposes no tokenizer call,
so ``generate.context_tokens`` would otherwise be an estimate (4 characters per
token), which under-counts code and non-English text. A GGUF file carries its
BPE vocabulary and merges (``tokenizer.ggml.*``) and names its pre-tokenizer
(``tokenizer.ggml.pre``); for the pre-tokenizers below, the same BPE built with
Hugging Face ``tokenizers`` counts exactly what llama.cpp counts (checked
against llama.cpp itself in tests/test_generate.py). Others return None, and
the caller keeps the estimate.
"""

from __future__ import annotations

import functools
import logging
import struct
from pathlib import Path
from typing import Any, BinaryIO

logger = logging.getLogger(__name__)

# llama.cpp's own pre-tokenizer expressions (src/llama-vocab.cpp), applied in order.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS: dict[str, list[str]] = {
    "qwen2": [_QWEN2],
    "smollm": [r"\p{N}", _GPT2],  # llama.cpp's STARCODER family: digits one by one first
    "starcoder": [r"\p{N}", _GPT2],
    "gpt-2": [_GPT2],
}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


def read_metadata(path: Path, prefix: str = "tokenizer.ggml.") -> dict[str, Any]:
    """The key/value metadata of a GGUF file whose keys start with ``prefix`` (the header
    is read up to the tensor table; the weights are never touched)."""
    try:
        return _read_metadata(path, prefix)
    except (struct.error, KeyError, MemoryError) as exc:  # cut short, or a bad value type
        raise ValueError(f"{path}: damaged GGUF header ({type(exc).__name__}: {exc})") from exc


def _read_metadata(path: Path, prefix: str) -> dict[str, Any]:
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, _, count = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 or later)")
        found: dict[str, Any] = {}
        for _ in range(count):
            key = _string(f)
            value = _value(f, struct.unpack("<I", f.read(4))[0])
            if key.startswith(prefix):
                found[key] = value
        return found


def _string(f: BinaryIO) -> str:
    (size,) = struct.unpack("<Q", f.read(8))
    data = f.read(size)
    if len(data) != size:
        raise struct.error(f"a string of {size} bytes ends after {len(data)}")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, size = struct.unpack("<IQ", f.read(12))
        if item == _STRING:
            return [_string(f) for _ in range(size)]
        fmt = _SCALARS[item]
        width = struct.calcsize(fmt)
        return list(struct.unpack(f"<{size}{fmt[1]}", f.read(width * size)))
    fmt = _SCALARS[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


@functools.lru_cache(maxsize=4)
def gguf_tokenizer(path: Path) -> Any | None:
    """A ``tokenizers.Tokenizer`` equal to the GGUF model's own, or None when its vocabulary
    is not a byte-level BPE with a pre-tokenizer listed in ``PRE_TOKENIZERS``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    meta = read_metadata(path)
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "gpt-2")
    if kind != "gpt2" or pre not in PRE_TOKENIZERS or "tokenizer.ggml.merges" not in meta:
        logger.info("%s: tokenizer %s/%s not rebuilt; token counts are estimated", path.name,
                    kind, pre)  # fmt: skip
        return None
    vocab = {token: i for i, token in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(expr), "isolated") for expr in PRE_TOKENIZERS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer

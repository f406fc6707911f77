"""Convert discovered files to Markdown with Docling.

PDF modes (``ConvertConfig.pdf_mode``):

* ``fast``: Docling's model-free ``NativePdfPipeline``; headings, paragraphs,
  lists and code are recovered from the text cells by :mod:`ragpipe.ingest.pdf_structure`.
* ``accurate``: Docling's standard pipeline (layout and table models, optional
  OCR). Needs the model weights on disk; a missing model is a
  :class:`StageError` that says how to provide them.
* ``auto``: accurate when its weights load from disk, else fast.

Hub downloads are disabled for the whole process: a run never fetches weights.
Markdown, HTML and DOCX go through Docling's simple pipeline; plain-text and
code files are read as UTF-8. Paged output carries a page marker line per
page (``schemas.PAGE_MARKER``).
"""

from __future__ import annotations

import codecs
import hashlib
import io
import logging
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragpipe import checkpoint
from ragpipe.config import ConvertConfig, PdfMode, RagpipeConfig, fingerprint
from ragpipe.errors import ConfigError, InputError, StageError
from ragpipe.ingest import runner
from ragpipe.ingest.isolate import IsolatedConverter
from ragpipe.ingest.pdf_structure import Line, lines_to_markdown
from ragpipe.schemas import (
    PAGE_MARKER,
    Document,
    Failure,
    SourceFile,
)

if TYPE_CHECKING:
    from docling.document_converter import DocumentConverter

logger = logging.getLogger(__name__)

# Docling escapes HTML (`a < b` -> `a &lt; b`) and underscores (`snake\\_case`) for
# rendering; ragpipe stores the document's own text, which is what is searched, shown and
# quoted (every output format escapes for its own syntax).
UNESCAPED: dict[str, bool] = {"escape_html": False, "escape_underscores": False}
# Bump when conversion output changes for the same input and config.
# 2: text stored unescaped (no &lt; or \\_ from Docling). 3: "-40" no bullet.
# 4: a numbered list item keeps its number ("1. Install", "- (a) Install"); a web page's
#    stored HTML always declares UTF-8 (a page's stale <meta charset> misread it).
# 5: fast PDF: a line broken at a word's own hyphen keeps it ("--no-restore", "cut-and-paste").
# 6: fast PDF: a short chapter's running head (two pages, under min_repeat) is dropped.
CONVERT_VERSION = "6"
DOC_NAMESPACE = uuid.UUID("6f1c3f0e-8a57-4c1e-9f53-2b4f5d7a9c11")

CONVERTER_FAST = "docling-native-pdf+ragpipe-structure"
CONVERTER_ACCURATE = "docling-standard-pdf"
CONVERTER_TEXT = "plain-text"
# Kinds Docling converts without any model: the kind -> its InputFormat's name. Zip-based
# ones are checked for the zip header first (a damaged file fails with a reason, not a
# traceback); OOXML protected by a password is an OLE container instead.
DOCLING_SIMPLE = {
    "markdown": "MD",
    "html": "HTML",
    "docx": "DOCX",
    "pptx": "PPTX",
    "xlsx": "XLSX",
    "opendocument": "ODT",  # with ODS and ODP below
    "epub": "EPUB",
    "email": "EMAIL",
    "asciidoc": "ASCIIDOC",
    "latex": "LATEX",
    "vtt": "VTT",
    "csv": "CSV",  # one Markdown table (split between rows by the chunker, header repeated)
}
ZIPPED = frozenset({"docx", "pptx", "xlsx", "opendocument", "epub"})
OLE_HEADER = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

WEIGHTS_HELP = (
    "Docling's layout/table model weights are not on this machine and ragpipe never downloads "
    "during a run. On a machine with internet run `docling-tools models download -o DIR` "
    "(add --all for OCR models), copy DIR here and set convert.artifacts_path: DIR "
    "(or RAGPIPE_CONVERT__ARTIFACTS_PATH=DIR); or use convert.pdf_mode: fast"
)


def doc_id_for(file_path: str) -> str:
    """Deterministic document id of a file path."""
    return str(uuid.uuid5(DOC_NAMESPACE, file_path))


def _forbid_downloads() -> None:
    # Weights must come from disk; a hub lookup would hang or fail mid-run offline.
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as hf_constants

        hf_constants.HF_HUB_OFFLINE = True
    except ImportError:  # pragma: no cover - docling depends on it
        pass


class Converter:
    """Converts one file at a time; Docling pipelines load on first use.

    Args:
        config: Conversion settings.
    """

    def __init__(self, config: ConvertConfig) -> None:
        self.config = config
        self._fast: DocumentConverter | None = None
        self._accurate: DocumentConverter | None = None
        self._simple: DocumentConverter | None = None
        self._accurate_error: str | None = None
        self._resolved: str | None = None

    # -- pipelines -----------------------------------------------------------------

    def _fast_converter(self) -> DocumentConverter:
        if self._fast is None:
            _forbid_downloads()
            from docling.datamodel.base_models import InputFormat
            from docling.datamodel.pipeline_options import NativePdfPipelineOptions
            from docling.document_converter import DocumentConverter, NativePdfFormatOption

            opts = NativePdfPipelineOptions(generate_page_images=False)
            self._fast = DocumentConverter(
                allowed_formats=[InputFormat.PDF],
                format_options={InputFormat.PDF: NativePdfFormatOption(pipeline_options=opts)},
            )
        return self._fast

    def _accurate_converter(self) -> DocumentConverter:
        if self._accurate is not None:
            return self._accurate
        if self._accurate_error is not None:
            raise StageError(self._accurate_error)
        _forbid_downloads()
        from docling.datamodel.base_models import InputFormat
        from docling.datamodel.pipeline_options import PdfPipelineOptions
        from docling.document_converter import DocumentConverter, PdfFormatOption

        artifacts = self.config.artifacts_path
        if artifacts is not None and not artifacts.is_dir():
            self._accurate_error = (
                f"convert.artifacts_path {artifacts} is not a directory. {WEIGHTS_HELP}"
            )
            raise StageError(self._accurate_error)
        opts = PdfPipelineOptions(
            artifacts_path=artifacts,
            do_ocr=self.config.do_ocr,
            do_table_structure=self.config.do_table_structure,
        )
        converter = DocumentConverter(
            allowed_formats=[InputFormat.PDF],
            format_options={InputFormat.PDF: PdfFormatOption(pipeline_options=opts)},
        )
        try:
            converter.initialize_pipeline(InputFormat.PDF)
        except (OSError, RuntimeError, ValueError) as exc:
            where = artifacts or "Docling's cache (~/.cache/docling, Hugging Face cache)"
            self._accurate_error = (
                f"accurate PDF mode cannot load its models from {where}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}. {WEIGHTS_HELP}"
            )
            raise StageError(self._accurate_error) from exc
        self._accurate = converter
        return converter

    def _simple_converter(self) -> DocumentConverter:
        if self._simple is None:
            _forbid_downloads()
            from docling.datamodel.base_models import InputFormat
            from docling.document_converter import DocumentConverter

            formats = [InputFormat[name] for name in DOCLING_SIMPLE.values()]
            self._simple = DocumentConverter(
                allowed_formats=[*formats, InputFormat.ODS, InputFormat.ODP]
            )
        return self._simple

    def pdf_converter_name(self) -> str:
        """Which PDF converter this configuration uses (resolving ``auto``)."""
        if self._resolved is not None:
            return self._resolved
        mode = self.config.pdf_mode
        if mode == PdfMode.FAST:
            self._resolved = CONVERTER_FAST
        elif mode == PdfMode.ACCURATE:
            self._accurate_converter()
            self._resolved = CONVERTER_ACCURATE
        else:
            try:
                self._accurate_converter()
                self._resolved = CONVERTER_ACCURATE
            except StageError as exc:
                logger.warning("pdf_mode auto: accurate models unavailable, using fast (%s)", exc)
                self._resolved = CONVERTER_FAST
        return self._resolved

    # -- conversion ----------------------------------------------------------------

    def convert(self, source: SourceFile, fingerprint: str) -> Document:
        """Convert one file.

        Raises:
            InputError: This file cannot be converted (category says why).
            StageError: The converter itself cannot run (e.g. missing weights).
        """
        path = Path(source.abs_path)
        try:
            with path.open("rb") as fh:
                head = fh.read(8192)
        except FileNotFoundError as exc:
            raise InputError(
                "vanished",
                "the file was deleted or moved after discovery; the next run drops it from the "
                "index",
            ) from exc
        except OSError as exc:
            raise InputError("unreadable", f"cannot read {path}: {exc.strerror}") from exc
        if not head:
            raise InputError("empty", "file is empty (0 bytes)")
        pages: int | None
        if source.kind == "pdf":
            converter, markdown, pages = self._convert_pdf(path, head)
        elif source.kind in DOCLING_SIMPLE:
            converter, markdown, pages = self._convert_simple(path, source.kind, head)
        else:
            converter, markdown, pages = CONVERTER_TEXT, _read_text(path), None
        if not markdown.strip():
            raise InputError("no_text", _no_text_reason(source.kind, converter))
        _unchanged_since_discovery(source, path)
        return Document(
            doc_id=doc_id_for(source.file_path),
            file_path=source.file_path,
            source_sha256=source.sha256,
            kind=source.kind,
            converter=converter,
            markdown=markdown,
            num_pages=pages,
            config_fingerprint=fingerprint,
        )

    def _convert_pdf(self, path: Path, head: bytes) -> tuple[str, str, int]:
        if b"%PDF-" not in head[:1024]:
            raise InputError("corrupt", "not a PDF: the %PDF- header is missing")
        name = self.pdf_converter_name()
        if name == CONVERTER_ACCURATE:
            result = _run_docling(self._accurate_converter().convert, path)
            doc = result.document
            n_pages = len(doc.pages)
            parts = []
            for page_no in sorted(doc.pages):
                parts.append(PAGE_MARKER.format(page=page_no))
                parts.append(doc.export_to_markdown(page_no=page_no, **UNESCAPED))
            return name, "\n\n".join(parts) + "\n", n_pages
        result = _run_docling(self._fast_converter().convert, path)
        lines: list[Line] = []
        for page in result.pages:
            parsed = page.parsed_page
            if parsed is None or page.size is None:
                continue
            for cell in parsed.textline_cells:
                if not cell.text.strip():
                    continue
                r = cell.rect
                top = min(r.r_y0, r.r_y1, r.r_y2, r.r_y3)
                bottom = max(r.r_y0, r.r_y1, r.r_y2, r.r_y3)
                if r.coord_origin.value != "TOPLEFT":
                    top, bottom = page.size.height - bottom, page.size.height - top
                lines.append(
                    Line(
                        page=page.page_no,
                        x0=min(r.r_x0, r.r_x1, r.r_x2, r.r_x3),
                        x1=max(r.r_x0, r.r_x1, r.r_x2, r.r_x3),
                        top=top,
                        bottom=bottom,
                        font=cell.font_name or "",
                        text=cell.text,
                        page_width=page.size.width,
                        page_height=page.size.height,
                    )
                )
        markdown, _ = lines_to_markdown(
            lines,
            size_ratio=self.config.heading_size_ratio,
            max_heading_chars=self.config.max_heading_chars,
        )
        return CONVERTER_FAST, markdown, len(result.pages)

    def _convert_simple(self, path: Path, kind: str, head: bytes) -> tuple[str, str, None]:
        if kind in ("markdown", "html", "asciidoc", "latex", "vtt", "csv", "email"):
            text = _read_text(path)  # binary junk / non-UTF-8 fail here with a clear category
            wide = next((codec for bom, codec in _WIDE_BOMS if head.startswith(bom)), None)
            if wide is not None:  # Docling reads these files' bytes as UTF-8
                raise InputError(
                    "encoding",
                    f"the file is {wide.upper()}, which Docling does not read for {kind}; "
                    f"re-encode it as UTF-8 (e.g. iconv -f {wide} -t utf-8)",
                )
            limit = self.config.max_html_depth
            if kind == "html" and html_depth(text, limit) > limit:
                raise InputError(
                    "too_deep",
                    f"HTML nested more than convert.max_html_depth={limit} elements deep; "
                    "Docling's HTML backend would take minutes to hours on it",
                )
        elif kind in ZIPPED and head.startswith(OLE_HEADER):
            raise InputError(
                "encrypted",
                f"a password-protected (or legacy binary) {kind.upper()} file: an OLE "
                "container, not the zip a readable one is; save it without a password",
            )
        elif kind in ZIPPED and not head.startswith(b"PK"):
            raise InputError("corrupt", f"not a {kind.upper()} file: the zip header is missing")
        source: Any = path
        if kind == "markdown" and (matter := front_matter(text)) is not None:
            # Docling read the block as a rule, an empty heading and a run-on paragraph
            # ("##\n\ntitle: My Doc author: Jane"): it is the document's metadata, and its
            # title the document's heading when the text starts with none.
            from docling.datamodel.base_models import DocumentStream

            title, body = matter
            if title and not body.lstrip().startswith("#"):
                body = f"# {title}\n\n{body}"
            source = DocumentStream(name=path.name, stream=io.BytesIO(body.encode("utf-8")))
        result = _run_docling(self._simple_converter().convert, source, path)
        return f"docling-simple-{kind}", result.document.export_to_markdown(**UNESCAPED), None


_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]*)[^>]*?(/?)>")
# Elements that never have children, and elements whose end tag HTML lets a page omit
# (counting those would take a page of unclosed <p>s for a deep tree).
_FLAT = frozenset(
    [
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "param",
        "source",
        "track",
        "wbr",
        "p",
        "li",
        "dt",
        "dd",
        "tr",
        "td",
        "th",
        "option",
        "optgroup",
        "tbody",
        "thead",
        "tfoot",
        "colgroup",
        "rp",
        "rt",
    ]
)


def html_depth(text: str, limit: int) -> int:
    """How deeply ``text``'s elements nest, counted in one linear pass; stops past ``limit``."""
    depth = deepest = 0
    for match in _TAG.finditer(text):
        closing, name, self_closing = match.groups()
        if name.lower() in _FLAT or self_closing:
            continue
        if closing:
            depth = max(0, depth - 1)
        else:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
    return deepest


def _no_text_reason(kind: str, converter: str) -> str:
    if kind != "pdf":
        return f"{converter} extracted no text"
    return (
        f"{converter} found no text layer: a scanned PDF? OCR needs convert.pdf_mode: accurate "
        "with convert.do_ocr: true and Docling's OCR weights"
    )


# The opening fence, the block up to its own closer (YAML's --- or ..., TOML's +++).
_FRONT_MATTER = re.compile(
    r"\A(?:---[ \t]*\n(?P<yaml>.*?)\n(?:---|\.\.\.)|\+\+\+[ \t]*\n(?P<toml>.*?)\n\+\+\+)"
    r"[ \t]*(?:\n|\Z)",
    re.S,
)
# Each line of a front matter block not indented under another: a key and its value.
_KEY_LINE = re.compile(r"^(?:[A-Za-z_][\w.-]*[ \t]*[:=]|#|-[ \t])")


def front_matter(text: str) -> tuple[str | None, str] | None:
    """A Markdown file's YAML (``---``) or TOML (``+++``) front matter: its title (if it
    has one as text) and the text after it; None when the file has none. Only a block of
    keys that parses as a mapping counts: a document that opens with a ``---`` rule (and
    has another further down) is text, all of it."""
    text = text.lstrip("\ufeff")
    found = _FRONT_MATTER.match(text)
    if found is None:
        return None
    block = found["yaml"] if found["yaml"] is not None else found["toml"]
    lines = [ln for ln in block.split("\n") if ln.strip() and not ln[0].isspace()]
    if not lines or not all(_KEY_LINE.match(ln) for ln in lines):
        return None  # a rule and prose ("Intro: the plan.", "## Budget"), not metadata
    import tomllib

    from ragpipe import yamlio

    try:  # yamlio: no alias bomb expands past its limit
        data = (yamlio.load(block, "front matter", yamlio.CONFIG_LIMIT)
                if found["yaml"] is not None else tomllib.loads(block))  # fmt: skip
    except (ConfigError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    title = data.get("title")
    title = " ".join(title.split()) if isinstance(title, str) and title.strip() else None
    return title, text[found.end() :]


def _run_docling(convert: Callable[..., Any], source: Any, path: Path | None = None) -> Any:
    """Docling's conversion of ``source`` (a path, or a stream of ``path``'s text)."""
    from docling.datamodel.base_models import ConversionStatus
    from docling.exceptions import ConversionError

    path = source if path is None else path
    try:
        result = convert(source, raises_on_error=False)
    except ConversionError as exc:
        raise _classify(path, str(exc)) from exc
    except (OSError, RuntimeError, ValueError) as exc:
        raise _classify(path, f"{type(exc).__name__}: {exc}") from exc
    if result.status not in (ConversionStatus.SUCCESS, ConversionStatus.PARTIAL_SUCCESS):
        messages = "; ".join(e.error_message for e in result.errors) or str(result.status)
        raise _classify(path, messages)
    if result.status == ConversionStatus.PARTIAL_SUCCESS:
        logger.warning("%s converted partially: %s", path, [e.error_message for e in result.errors])
    return result


def _classify(path: Path, message: str) -> InputError:
    """Turn a Docling failure into a failure category a user can act on."""
    if path.suffix.lower() == ".pdf" and _is_encrypted_pdf(path):
        return InputError(
            "encrypted", "PDF is password-protected; decrypt it (e.g. qpdf --decrypt)"
        )
    first = message.strip().splitlines()[0] if message.strip() else "conversion failed"
    return InputError("corrupt", f"Docling could not convert the file: {first[:300]}")


def _is_encrypted_pdf(path: Path) -> bool:
    try:
        import pypdfium2
    except ImportError:  # pragma: no cover - a docling dependency
        return False
    try:
        pypdfium2.PdfDocument(str(path)).close()
    except pypdfium2.PdfiumError as exc:
        return "password" in str(exc).lower()
    return False


# UTF-32 first: its little-endian mark begins with UTF-16's.
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
              (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # fmt: skip


def _unchanged_since_discovery(source: SourceFile, path: Path) -> None:
    """InputError when a file of the corpus no longer holds the bytes discovery hashed: the
    document is stamped with that hash, so text read from a file being rewritten (a copy
    over it, an ``rsync --inplace``) was kept under the old hash for good once the file
    settled back (the next plan said "unchanged"). Pages, objects and records are ragpipe's
    own copies, hashed otherwise (a page's body, a record's fields), and not rewritten."""
    from ragpipe.ingest.discover import sha256_file  # discovery's own hash

    if "://" in source.file_path or source.kind == "record":
        return
    try:
        digest = sha256_file(path)
    except OSError as exc:
        raise InputError("vanished", f"the file went away while it was read: {exc}") from exc
    if digest != source.sha256:
        raise InputError(
            "changed",
            "the file changed after discovery hashed it (written while this run read it?): "
            "not indexed from this read; the next run converts it again",
        )


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    # A byte-order mark says UTF-16 or UTF-32 (what Windows' Notepad saves as "Unicode"):
    # read as such, where its NUL bytes said "binary".
    wide = next((codec for bom, codec in _WIDE_BOMS if data.startswith(bom)), None)
    if wide is not None:
        try:
            text = data.decode(wide)
        except UnicodeDecodeError as exc:
            raise InputError(
                "encoding",
                f"starts as {wide.upper()} but is not valid {wide.upper()} at byte "
                f"{exc.start}; re-encode the file as UTF-8 (e.g. iconv -f {wide} -t utf-8)",
            ) from exc
        if "\x00" in text:
            raise InputError("binary", "file holds binary data (NUL characters), not text")
        return text.replace("\r\n", "\n").replace("\r", "\n")
    if b"\x00" in data:  # anywhere: one past the first 8 KiB reached the chunks
        raise InputError("binary", "file holds binary data (NUL bytes), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            "encoding",
            f"not valid UTF-8 at byte {exc.start}; re-encode the file as UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8)",
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


# -- convert -------------------------------------------------------------------------


def _cache_key(source: SourceFile, config_fp: str) -> str:
    raw = f"{source.file_path}\x1f{source.sha256}\x1f{config_fp}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def settings_fingerprint(config: ConvertConfig) -> str:
    """The convert settings that change a converted document. Limits that only refuse
    documents (``max_html_depth``, ``timeout_s``) are left out: adding or moving one must
    not re-convert and re-embed a whole index."""
    fields = set(ConvertConfig.model_fields) - {"max_html_depth", "timeout_s"}
    return fingerprint(config, CONVERT_VERSION, include=fields)


def stage_fingerprint(config: ConvertConfig) -> str:
    """The convert stage's configuration fingerprint (its checkpoints' key)."""
    return _convert_fingerprint(Converter(config))


def _convert_fingerprint(converter: Converter) -> str:
    # auto mode resolves to the converter actually available; it is part of the key.
    resolved = converter.pdf_converter_name()
    return checkpoint.combine_fingerprints([settings_fingerprint(converter.config), resolved])


def convert_batches(
    config: RagpipeConfig, planned: runner.StageSummary[Any], size: int
) -> list[list[SourceFile]]:
    """The planned files not converted yet, in batches of ``size`` (for fan-out)."""
    work = runner.WorkDir.of(config)
    sources = checkpoint.read_records(work.files(planned.stage), SourceFile)
    cache_dir = work.convert_cache
    config_fp = _convert_fingerprint(Converter(config.convert))
    todo = [s for s in sources if not (cache_dir / f"{_cache_key(s, config_fp)}.parquet").is_file()]
    return [todo[i : i + size] for i in range(0, len(todo), size)]


def convert_batch(config: RagpipeConfig, sources: Sequence[SourceFile]) -> int:
    """Convert ``sources`` into the per-document cache; returns how many were converted.

    Run in parallel (one batch per worker) before ``run_convert``, which then
    finds them cached. A file that fails here is left to ``run_convert``,
    which records its failure row.
    """
    config_fp = _convert_fingerprint(Converter(config.convert))
    cache_dir = runner.WorkDir.of(config).convert_cache
    converted = 0
    with _bounded(config.convert) as converter:
        for source in sources:
            cached = cache_dir / f"{_cache_key(source, config_fp)}.parquet"
            if cached.is_file():
                continue
            try:
                doc = converter.convert(source, config_fp)
            except (InputError, StageError):
                continue
            checkpoint.write_records(cached, [doc], Document)
            converted += 1
    return converted


@contextmanager
def _bounded(config: ConvertConfig) -> Iterator[Converter | IsolatedConverter]:
    """The converter documents go through: in a child process under ``timeout_s`` per
    document, or in this process when ``timeout_s`` is 0."""
    if not config.timeout_s:
        yield Converter(config)
        return
    with IsolatedConverter(config, config.timeout_s) as isolated:
        yield isolated


@dataclass
class ConvertCounts(runner.Counts):
    """Documents converted now or found in the cache, failures, and per converter."""

    documents: int = 0
    converted: int = 0
    skipped_unchanged: int = 0
    failed: int = 0
    by_converter: dict[str, int] = field(default_factory=dict, metadata={"prefix": "converter"})

    def mark_reused(self) -> None:
        self.converted, self.skipped_unchanged = 0, self.documents


def run_convert(
    config: RagpipeConfig, discovered: runner.StageSummary[Any]
) -> runner.StageSummary[ConvertCounts]:
    """Convert every discovered file, reusing per-document cache entries."""
    started = time.perf_counter()
    work = runner.WorkDir.of(config)
    here = work.stage("convert")
    config_fp = _convert_fingerprint(Converter(config.convert))
    plan_id = discovered.plan_id
    reused = runner.reuse_stage(
        here, "convert", config_fp, discovered.output_fingerprint, ConvertCounts, plan_id
    )
    if reused:  # this run converted nothing
        return reused
    # The files to convert: the plan's (only new and changed files) or discover's (all).
    sources = runner.read_input(config, discovered, "files.parquet", SourceFile)
    cache_dir = work.convert_cache
    stats: Counter[str] = Counter()

    def convert_one(converter: Converter | IsolatedConverter, source: SourceFile) -> Document:
        cached = cache_dir / f"{_cache_key(source, config_fp)}.parquet"
        if cached.is_file():
            try:
                (doc,) = checkpoint.read_records(cached, Document)
                stats["skipped_unchanged"] += 1
                return doc
            except (StageError, ValueError):
                logger.warning("convert cache entry %s unreadable; converting again", cached)
        doc = converter.convert(source, config_fp)
        checkpoint.write_records(cached, [doc], Document)  # durable before counted done
        stats["converted"] += 1
        return doc

    with _bounded(config.convert) as bounded:  # its child starts only if a file needs it
        docs, failures = runner.per_document(
            "convert", sources, partial(convert_one, bounded), lambda s: (s.file_path, s.sha256)
        )
    _prune_cache(cache_dir, {_cache_key(s, config_fp) for s in sources})
    remember_converters(here / CONVERTERS, docs)
    counts = ConvertCounts(
        len(docs),
        stats["converted"],
        stats["skipped_unchanged"],
        len(failures),
        dict(Counter(d.converter for d in docs)),
    )
    return runner.finish_stage(
        here,
        "convert",
        config_fp,
        discovered.output_fingerprint,
        {"documents": (docs, Document), "failures": (failures, Failure)},
        counts,
        started,
        plan_id,
    )


CONVERTERS = "converters.parquet"  # every indexed file's converter and pages, kept


def remember_converters(path: Path, docs: Sequence[Document]) -> None:
    """Add this run's documents' converter and page count to ``path`` (one row a file, the
    newest): a run converts only new and changed files, so `ragpipe inspect files` showed
    no converter and no pages for any file after a run that changed nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: dict[str, dict[str, Any]] = {}
    if path.is_file():
        try:
            rows = {r["file_path"]: r for r in pq.read_table(path).to_pylist()}
        except (OSError, ValueError, KeyError, pa.ArrowException):  # informative only
            logger.warning("%s unreadable: written again from this run's documents", path)
    for doc in docs:
        rows[doc.file_path] = {"file_path": doc.file_path, "source_sha256": doc.source_sha256,
                               "converter": doc.converter, "num_pages": doc.num_pages}  # fmt: skip
    schema = pa.schema([("file_path", pa.string()), ("source_sha256", pa.string()),
                        ("converter", pa.string()), ("num_pages", pa.int64())])  # fmt: skip
    checkpoint.write_table(path, pa.Table.from_pylist(list(rows.values()), schema=schema))


def _prune_cache(cache_dir: Path, keep: set[str]) -> None:
    """Drop cache entries of files that no longer exist or changed."""
    if not cache_dir.is_dir():
        return
    for entry in cache_dir.glob("*.parquet"):
        if entry.stem not in keep:
            entry.unlink(missing_ok=True)

"""Convert discovered files to Markdown with Docling.

PDF modes (``ConvertConfig.pdf_mode``):

* ``fast``: Docling's model-free ``NativePdfPipeline``; headings, paragraphs,
  lists and code are recovered from the text cells by :mod:`ragpipe.pdf_structure`.
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

import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragpipe.config import ConvertConfig, PdfMode
from ragpipe.errors import InputError, StageError
from ragpipe.pdf_structure import Line, lines_to_markdown
from ragpipe.schemas import PAGE_MARKER, Document, SourceFile

if TYPE_CHECKING:
    from docling.document_converter import DocumentConverter

logger = logging.getLogger(__name__)

# Docling escapes HTML (`a < b` -> `a &lt; b`) and underscores (`snake\\_case`) for
# rendering; ragpipe stores the document's own text, which is what is searched, shown and
# quoted (every output format escapes for its own syntax).
UNESCAPED: dict[str, bool] = {"escape_html": False, "escape_underscores": False}
# Bump when conversion output changes for the same input and config.
CONVERT_VERSION = "2"  # 2: text stored unescaped (no &lt; or \\_ from Docling)
DOC_NAMESPACE = uuid.UUID("6f1c3f0e-8a57-4c1e-9f53-2b4f5d7a9c11")

CONVERTER_FAST = "docling-native-pdf+ragpipe-structure"
CONVERTER_ACCURATE = "docling-standard-pdf"
CONVERTER_TEXT = "plain-text"

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

            self._simple = DocumentConverter(
                allowed_formats=[InputFormat.MD, InputFormat.HTML, InputFormat.DOCX]
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
        elif source.kind in ("markdown", "html", "docx"):
            converter, markdown, pages = self._convert_simple(path, source.kind, head)
        else:
            converter, markdown, pages = CONVERTER_TEXT, _read_text(path), None
        if not markdown.strip():
            raise InputError("no_text", _no_text_reason(source.kind, converter))
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
        if kind in ("markdown", "html"):
            _read_text(path)  # binary junk / non-UTF-8 fail here with a clear category
        elif not head.startswith(b"PK"):
            raise InputError("corrupt", "not a DOCX file: the zip header is missing")
        result = _run_docling(self._simple_converter().convert, path)
        return f"docling-simple-{kind}", result.document.export_to_markdown(**UNESCAPED), None


def _no_text_reason(kind: str, converter: str) -> str:
    if kind != "pdf":
        return f"{converter} extracted no text"
    return (
        f"{converter} found no text layer: a scanned PDF? OCR needs convert.pdf_mode: accurate "
        "with convert.do_ocr: true and Docling's OCR weights"
    )


def _run_docling(convert: Callable[..., Any], path: Path) -> Any:
    from docling.datamodel.base_models import ConversionStatus
    from docling.exceptions import ConversionError

    try:
        result = convert(path, raises_on_error=False)
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


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
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

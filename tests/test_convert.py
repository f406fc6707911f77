"""Real Docling conversions of the shared PDFs, golden files, and bad inputs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ragpipe.config import CleanConfig, ConvertConfig, PdfMode
from ragpipe.errors import InputError, StageError
from ragpipe.ingest.clean import clean_markdown
from ragpipe.ingest.convert import CONVERTER_FAST, Converter
from ragpipe.ingest.discover import sha256_file
from ragpipe.ingest.fidelity import compare
from ragpipe.schemas import SourceFile
from tests.support.paths import SHARED, shared_pdf

GOLDEN = Path(__file__).parent / "golden"
# Set RAGPIPE_REGEN_GOLDEN=1 to rewrite the golden files after an intended change.
REGENERATE = os.environ.get("RAGPIPE_REGEN_GOLDEN") == "1"


def _source(path: Path, kind: str) -> SourceFile:
    return SourceFile(str(path), str(path), str(path.parent), kind, path.stat().st_size,
                      sha256_file(path))  # fmt: skip


@pytest.fixture(scope="module")
def converter() -> Converter:
    return Converter(ConvertConfig())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["multi_page", "code_and_formula", "amt_handbook_sample"])
def test_fast_mode_golden_convert_and_clean(converter: Converter, name: str) -> None:
    pdf = shared_pdf(f"{name}.pdf")
    doc = converter.convert(_source(pdf, "pdf"), "fp")
    assert doc.converter == CONVERTER_FAST
    cleaned = clean_markdown(doc.markdown, CleanConfig()).markdown
    golden = GOLDEN / f"{name}.md"
    if REGENERATE:  # a regeneration run never passes: review the diff, then run again
        golden.write_text(cleaned, encoding="utf-8")
        pytest.fail(f"rewrote {golden}; check `git diff`, then re-run without RAGPIPE_REGEN_GOLDEN")
    assert cleaned == golden.read_text(encoding="utf-8")


@pytest.mark.slow
def test_fast_mode_fidelity_and_pages(converter: Converter) -> None:
    pdf = shared_pdf("multi_page.pdf")
    doc = converter.convert(_source(pdf, "pdf"), "fp")
    assert doc.num_pages == 5
    assert [f"<!-- ragpipe:page {p} -->" in doc.markdown for p in range(1, 6)] == [True] * 5
    fid = compare(doc.markdown, (SHARED / "groundtruth" / "multi_page.md").read_text())
    assert fid.heading_recall == 1.0 and fid.heading_precision == 1.0
    assert fid.text_f1 > 0.99


@pytest.mark.slow
def test_simple_pipeline_formats(converter: Converter, tmp_path: Path) -> None:
    import docx

    html = tmp_path / "page.html"
    html.write_text("<html><body><h1>Title</h1><p>Hello <b>world</b>.</p></body></html>")
    doc = converter.convert(_source(html, "html"), "fp")
    assert doc.converter == "docling-simple-html"
    assert doc.markdown.startswith("# Title\n\nHello **world**")

    word = docx.Document()
    word.add_heading("Quarterly plan", level=1)
    word.add_paragraph("Ship the ingest flow.")
    path = tmp_path / "plan.docx"
    word.save(str(path))
    doc = converter.convert(_source(path, "docx"), "fp")
    assert doc.converter == "docling-simple-docx"
    assert "Quarterly plan" in doc.markdown and "Ship the ingest flow." in doc.markdown

    md = tmp_path / "n.md"
    md.write_text("# Notes\n\nSome *text*.\n")
    doc = converter.convert(_source(md, "markdown"), "fp")
    assert doc.converter == "docling-simple-markdown"
    assert "# Notes" in doc.markdown


def test_text_is_stored_as_written_not_escaped_for_rendering(
    converter: Converter, tmp_path: Path
) -> None:
    # Docling's Markdown export escapes `<`, `&` and `_` (issue 16 D: XML output then
    # escaped them twice); the index holds the document's own characters.
    md = tmp_path / "ops.md"
    md.write_text("# Ops\n\nIf a < b && c > d, call snake_case() at AT&T.\n")
    html = tmp_path / "ops.html"
    html.write_text("<html><body><p>If a &lt; b &amp;&amp; c &gt; d, call snake_case().</p>")
    wanted = "If a < b && c > d, call snake_case()"
    for path, kind in ((md, "markdown"), (html, "html")):
        text = converter.convert(_source(path, kind), "fp").markdown
        assert wanted in text and "&lt;" not in text and "&amp;" not in text, text
        assert "\\_" not in text


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    from pypdf import PdfWriter

    corrupt = tmp_path / "corrupt.pdf"
    corrupt.write_bytes(b"%PDF-1.7\n" + os.urandom(4000))
    encrypted = tmp_path / "encrypted.pdf"
    writer = PdfWriter(clone_from=shared_pdf("code_and_formula.pdf"))
    writer.encrypt(user_password="secret", owner_password="owner", algorithm="RC4-128")
    writer.write(encrypted)
    empty = tmp_path / "empty.md"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.md"
    junk.write_bytes(os.urandom(2000) + b"\x00")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    not_pdf = tmp_path / "fake.pdf"
    not_pdf.write_text("just text")
    return {
        "corrupt": (corrupt, "pdf"),
        "encrypted": (encrypted, "pdf"),
        "empty": (empty, "markdown"),
        "binary": (junk, "markdown"),
        "encoding": (latin, "text"),
        "not_pdf": (not_pdf, "pdf"),
    }


def test_front_matter_is_metadata_and_its_title_the_heading(
    converter: Converter, tmp_path: Path
) -> None:
    """Docling read a YAML front matter as a rule, an empty heading and a run-on paragraph:
    '##\\n\\ntitle: My Doc author: Jane' was the first chunk, under no heading."""
    cases = {
        "---\ntitle: My Doc\nauthor: Jane\n---\n\nIntro text.\n\n## Part\n\nMore.\n":
            "# My Doc\n\nIntro text.\n\n## Part\n\nMore.",
        "---\ntitle: 'Quoted'\n---\n# Own Heading\n\nBody.\n": "# Own Heading\n\nBody.",
        "+++\ntitle = \"TOML\"\n+++\nBody.\n": "# TOML\n\nBody.",
        "---\nauthor: Jane\n---\nBody.\n": "Body.",  # no title: no heading made up
        "---\n\nJust a rule above.\n": "Just a rule above.",  # a rule, not metadata
        # The last review: a rule, prose, another rule further down was taken for front
        # matter, and the intro and a whole section went.
        "---\n\nIntro: the plan.\n\n## Budget\n\nMoney.\n\n---\n\nAppendix.\n":
            "Intro: the plan.\n\n## Budget\n\nMoney.\n\nAppendix.",  # as Docling reads it
        "---\nThe ratio a=b holds\n---\nBody\n": "## The ratio a=b holds\n\nBody",  # setext
        "---\ntitle:\nauthor: Jane\n---\nBody.\n": "Body.",  # an empty title: none
        "---\ntitle: >\n  Folded title\n---\nBody.\n": "# Folded title\n\nBody.",
    }  # fmt: skip
    for i, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"{i}.md"
        path.write_text(text, encoding="utf-8")
        assert converter.convert(_source(path, "markdown"), "fp").markdown == expected, text


def test_a_utf16_text_file_is_read_and_a_utf16_markdown_file_refused(
    converter: Converter, tmp_path: Path
) -> None:
    """What Windows' Notepad saves as "Unicode": its NUL bytes said "binary"."""
    text = "# Notes\n\nCafé crème, 北京.\r\n"
    for codec in ("utf-16-le", "utf-16-be", "utf-32-le"):
        path = tmp_path / f"{codec}.txt"
        path.write_bytes(("\ufeff" + text).encode(codec))  # with its byte-order mark
        doc = converter.convert(_source(path, "text"), "fp")
        assert doc.markdown == "# Notes\n\nCafé crème, 北京.\n", codec
    markdown = tmp_path / "notes.md"
    markdown.write_bytes(("\ufeff" + text).encode("utf-16-le"))
    with pytest.raises(InputError, match=r"UTF-16.*iconv -f utf-16 -t utf-8") as err:
        converter.convert(_source(markdown, "markdown"), "fp")
    assert err.value.category == "encoding"
    late_nul = tmp_path / "late.txt"
    late_nul.write_bytes(b"text " * 3000 + b"\x00 more")  # past the first 8 KiB
    with pytest.raises(InputError) as err:
        converter.convert(_source(late_nul, "text"), "fp")
    assert err.value.category == "binary"


@pytest.mark.slow
def test_bad_inputs_raise_categorised_input_errors(converter: Converter, tmp_path: Path) -> None:
    expected = {
        "corrupt": "corrupt",
        "encrypted": "encrypted",
        "empty": "empty",
        "binary": "binary",
        "encoding": "encoding",
        "not_pdf": "corrupt",
    }
    got = {}
    for name, (path, kind) in _bad_inputs(tmp_path).items():
        with pytest.raises(InputError) as err:
            converter.convert(_source(path, kind), "fp")
        got[name] = err.value.category
    assert got == expected


def test_accurate_mode_without_weights_fails_clearly(tmp_path: Path) -> None:
    empty_models = tmp_path / "models"
    empty_models.mkdir()
    for cfg in (ConvertConfig(pdf_mode=PdfMode.ACCURATE, artifacts_path=empty_models),
                ConvertConfig(pdf_mode=PdfMode.ACCURATE)):  # fmt: skip
        with pytest.raises(StageError) as err:
            Converter(cfg).pdf_converter_name()
        message = str(err.value)
        assert "docling-tools models download" in message
        assert "convert.artifacts_path" in message
        assert "Traceback" not in message
    missing = ConvertConfig(pdf_mode=PdfMode.ACCURATE, artifacts_path=tmp_path / "nope")
    with pytest.raises(StageError, match="is not a directory"):
        Converter(missing).pdf_converter_name()


@pytest.mark.slow
def test_auto_mode_falls_back_to_fast_and_records_it(tmp_path: Path) -> None:
    pdf = tmp_path / "doc.pdf"
    shutil.copy(shared_pdf("multi_page.pdf"), pdf)
    converter = Converter(ConvertConfig(pdf_mode=PdfMode.AUTO))
    doc = converter.convert(_source(pdf, "pdf"), "fp")
    assert doc.converter == CONVERTER_FAST


# The Markdown of each sample in tests/support/formats.py, as a person would write it.
FORMATS_MARKDOWN = {
    "pptx": "# Quarterly review\n\n- Revenue grew by nine percent.\n- Churn fell to two percent.",
    "xlsx": "| item   |   price |\n|--------|---------|\n"
    "| bread  |       3 |\n| milk   |       1 |",
    "opendocument": "## Leave policy\n\nStaff get twenty-five days of leave a year.",
    "epub": "# Expenses\n\nClaim expenses within thirty days.",
    "email": "# Backup schedule\n\nFrom: ops@example.org\n\nTo: team@example.org\n\n"
    "The nightly backup moves to three o'clock from Monday.",
    "asciidoc": "# Client guide\n\n## Installing\n\nRun the installer and sign in.",
    "latex": "## Results\n\nThe model converges in ten steps.",
    "vtt": "Welcome to the onboarding session.\n\nFirst, install the client.",
    "csv": "| day     | on call   |\n|---------|-----------|\n| Monday  | Ana       |\n"
    "| Tuesday | Ben       |",
}


def test_docling_model_free_formats_convert_to_their_markdown(
    converter: Converter, tmp_path: Path
) -> None:
    from tests.support.formats import write_samples

    got = {}
    for kind, path in write_samples(tmp_path).items():
        doc = converter.convert(_source(path, kind), "fp")
        assert doc.converter == f"docling-simple-{kind}"
        got[kind] = doc.markdown.strip()
    assert got == FORMATS_MARKDOWN


def test_damaged_and_protected_office_files_fail_with_a_reason(
    converter: Converter, tmp_path: Path
) -> None:
    cases = {
        "torn.pptx": (b"PK\x03\x04" + os.urandom(3000), "pptx", "corrupt"),
        "random.epub": (os.urandom(3000), "epub", "corrupt"),
        # A password-protected XLSX is an OLE container (what Excel writes), not a zip.
        "locked.xlsx": (bytes.fromhex("d0cf11e0a1b11ae1") + os.urandom(3000), "xlsx",
                        "encrypted"),
        "junk.vtt": (os.urandom(2000) + b"\x00", "vtt", "binary"),
    }  # fmt: skip
    got = {}
    for name, (data, kind, _) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(InputError) as err:
            converter.convert(_source(path, kind), "fp")
        got[name] = err.value.category
        assert "Traceback" not in str(err.value)
    assert got == {name: category for name, (_, _, category) in cases.items()}


@pytest.mark.integration
def test_a_mixed_folder_of_every_format_ingests_in_one_run(tmp_path: Path) -> None:
    from ragpipe.config import RagpipeConfig
    from ragpipe.ingest.pipeline import run_ingest
    from ragpipe.store import open_reader
    from tests.support.formats import write_long_tables, write_samples

    samples = write_samples(tmp_path / "share")
    samples.update({f"long-{k}": p for k, p in write_long_tables(tmp_path / "share").items()})
    (tmp_path / "share" / "torn.pptx").write_bytes(b"PK\x03\x04" + os.urandom(3000))
    config = RagpipeConfig.model_validate({
        "discover": {"roots": [str(tmp_path / "share")]},
        "embed": {"provider": "onnx"},
        "store": {"path": str(tmp_path / "store")},
        "paths": {"work_dir": str(tmp_path / "work")},
    })  # fmt: skip
    summary = run_ingest(config)
    assert (summary.failed, summary.added) == (1, len(samples) + 1)  # the torn one is seen too
    store = open_reader(config.store, "paraphrase-MiniLM-L3-v2")
    assert store is not None
    try:
        indexed = {
            Path(str(h.payload["file_path"])).name for h in store.scroll(fields=["file_path"])
        }
    finally:
        store.close()
    assert indexed == {p.name for p in samples.values()}
    import pyarrow.parquet as pq

    (failure,) = pq.read_table(tmp_path / "work" / "failures.parquet").to_pylist()
    assert failure["file_path"].endswith("torn.pptx") and failure["category"] == "corrupt"

    # Tables longer than a chunk: split between rows, every part with the header rows.
    chunks = pq.read_table(tmp_path / "work" / "chunk" / "chunks.parquet").to_pylist()
    for name, columns in {"settings.csv": "setting", "limits.xlsx": "server"}.items():
        parts = [c["text"] for c in chunks if c["file_path"].endswith(name)]
        header = "\n".join(parts[0].split("\n")[:2])  # Docling pads cells to the widest
        assert header.startswith(f"| {columns} ") and set(header.split("\n")[1]) == {"|", "-"}
        assert len(parts) > 3
        assert all(p.startswith(header + "\n| ") for p in parts), name
        rows = [line for p in parts for line in p.split("\n")[2:]]
        assert len(rows) == len(set(rows)) == 120  # each row once, none cut

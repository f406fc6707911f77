"""Small real documents in Docling's model-free formats, written by the test (python-pptx,
openpyxl, the stdlib's email and zipfile for OpenDocument and EPUB): each holds one heading
and one sentence a person can check in the Markdown."""

from __future__ import annotations

import email.message
import zipfile
from pathlib import Path

_ODT_CONTENT = (
    '<?xml version="1.0" encoding="UTF-8"?><office:document-content '
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.2">'
    '<office:body><office:text><text:h text:outline-level="1">Leave policy</text:h>'
    "<text:p>Staff get twenty-five days of leave a year.</text:p>"
    "</office:text></office:body></office:document-content>"
)
_ODT_MANIFEST = (
    '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest '
    'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.2">'
    '<manifest:file-entry manifest:full-path="/" '
    'manifest:media-type="application/vnd.oasis.opendocument.text"/>'
    '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
    "</manifest:manifest>"
)
_EPUB_CONTAINER = (
    '<?xml version="1.0"?><container version="1.0" '
    'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
    '<rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
    "</rootfiles></container>"
)
_EPUB_OPF = (
    '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
    'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
    '<dc:identifier id="id">handbook</dc:identifier><dc:title>Handbook</dc:title>'
    "<dc:language>en</dc:language></metadata><manifest>"
    '<item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/></manifest>'
    '<spine><itemref idref="c1"/></spine></package>'
)
_EPUB_CHAPTER = (
    '<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>One'
    "</title></head><body><h1>Expenses</h1><p>Claim expenses within thirty days.</p>"
    "</body></html>"
)


def write_samples(folder: Path) -> dict[str, Path]:
    """One file per format, by its kind; returns kind -> path."""
    from openpyxl import Workbook
    from pptx import Presentation

    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Quarterly review"
    slide.placeholders[1].text = "Revenue grew by nine percent.\nChurn fell to two percent."
    out["pptx"] = folder / "review.pptx"
    deck.save(str(out["pptx"]))
    book = Workbook()
    sheet = book.active
    sheet.title = "Prices"
    for row in (["item", "price"], ["bread", 3], ["milk", 1]):
        sheet.append(row)
    out["xlsx"] = folder / "prices.xlsx"
    book.save(out["xlsx"])
    out["opendocument"] = folder / "policy.odt"
    with zipfile.ZipFile(out["opendocument"], "w") as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/vnd.oasis.opendocument.text")
        z.writestr("content.xml", _ODT_CONTENT)
        z.writestr("META-INF/manifest.xml", _ODT_MANIFEST)
    out["epub"] = folder / "handbook.epub"
    with zipfile.ZipFile(out["epub"], "w") as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        z.writestr("META-INF/container.xml", _EPUB_CONTAINER)
        z.writestr("OEBPS/content.opf", _EPUB_OPF)
        z.writestr("OEBPS/c1.xhtml", _EPUB_CHAPTER)
    mail = email.message.EmailMessage()
    mail["Subject"] = "Backup schedule"
    mail["From"] = "ops@example.org"
    mail["To"] = "team@example.org"
    mail.set_content("The nightly backup moves to three o'clock from Monday.")
    out["email"] = folder / "backup.eml"
    out["email"].write_bytes(bytes(mail))
    out["asciidoc"] = folder / "guide.adoc"
    out["asciidoc"].write_text(
        "= Client guide\n\n== Installing\n\nRun the installer and sign in.\n"
    )
    out["latex"] = folder / "paper.tex"
    out["latex"].write_text(
        "\\documentclass{article}\\begin{document}\\section{Results}"
        "The model converges in ten steps.\\end{document}\n"
    )
    out["vtt"] = folder / "onboarding.vtt"
    out["vtt"].write_text(
        "WEBVTT\n\n00:00:01.000 --> 00:00:04.000\nWelcome to the onboarding session.\n\n"
        "00:00:05.000 --> 00:00:08.000\nFirst, install the client.\n"
    )
    out["csv"] = folder / "rota.csv"
    out["csv"].write_text("day,on call\nMonday,Ana\nTuesday,Ben\n")
    return out


def write_long_tables(folder: Path, rows: int = 120) -> dict[str, Path]:
    """A CSV and a spreadsheet of ``rows`` rows each: too long for one chunk."""
    from openpyxl import Workbook

    folder.mkdir(parents=True, exist_ok=True)
    header = ["setting", "default", "meaning"]
    data = [[f"option_{i}", str(i * 10), f"how long step {i} may run"] for i in range(rows)]
    csv_path = folder / "settings.csv"
    csv_path.write_text("\n".join(",".join(r) for r in [header, *data]) + "\n")
    book = Workbook()
    sheet = book.active
    sheet.title = "Limits"
    for row in [
        ["server", "port", "owner"],
        *[[f"host{i}", 8000 + i, f"team {i % 7}"] for i in range(rows)],
    ]:
        sheet.append(row)
    xlsx_path = folder / "limits.xlsx"
    book.save(xlsx_path)
    return {"csv": csv_path, "xlsx": xlsx_path}


def write_docx_table(path: Path, rows: int = 60) -> Path:
    """A DOCX (python-docx) with a heading and a ``rows``-row table of releases."""
    import docx

    document = docx.Document()
    document.add_heading("Release history", level=1)
    table = document.add_table(rows=rows + 1, cols=3)
    for j, name in enumerate(["version", "date", "highlights"]):
        table.cell(0, j).text = name
    for i in range(rows):
        for j, value in enumerate([f"1.{i}", f"2025-{1 + i % 12:02d}-01", f"fixes {i} bugs"]):
            table.cell(i + 1, j).text = value
    path.parent.mkdir(parents=True, exist_ok=True)
    document.save(str(path))
    return path

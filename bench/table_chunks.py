"""Tables through clean and chunk: does every chunk holding table rows carry the table's header,
before (chunker v1: tables chunked like prose) and now (v2: split between rows, header and
caption repeated)? And do the dev sets, which hold no pipe tables, chunk exactly as before?

Tables measured, at the default chunk settings (recursive, chunk.size, MiniLM's window):

* the shipped PDFs' tables as Docling's layout models render them (the ground-truth Markdown
  in ../shared/corpus/groundtruth; fast mode renders no tables);
* a CSV and an XLSX of 120 rows (tests/support/formats.py) and a DOCX with a 60-row table,
  converted by Docling.

A chunk "holds rows" when it contains a data row of a table; it "has its header" when its
text contains the table's header row. Rows cut mid-row are counted too.

Dev sets: every debfaq document (BEIR, as bench/retrieval_quality.py indexes it) and R-FAQ
(converted in fast mode and cleaned) are chunked by v1 and v2; the number of documents whose
chunks differ must be 0 (then retrieval on both dev sets is unchanged: no loss).

Results: bench/results/table_chunks.json.

Usage: python bench/table_chunks.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "corpus"

from ragpipe.config import ChunkConfig, CleanConfig, ConvertConfig  # noqa: E402
from ragpipe.ingest.chunk import (  # noqa: E402
    TokenCounter,
    chunk_document,
    find_tables,
    recursive_spans,
    split_sections,
    strip_page_markers,
)
from ragpipe.ingest.clean import clean_markdown  # noqa: E402
from ragpipe.ingest.convert import Converter  # noqa: E402
from ragpipe.ingest.discover import sha256_file  # noqa: E402
from ragpipe.schemas import CleanedDocument, SourceFile  # noqa: E402
from tests.support.formats import write_docx_table, write_long_tables  # noqa: E402


def v1_texts(markdown: str, kind: str, config: ChunkConfig, counter: TokenCounter) -> list[str]:
    """The chunks of chunker v1: every section through recursive_spans with no table spans to
    keep overlaps out of (exactly v1's code path), tables chunked as prose."""
    text, _ = strip_page_markers(markdown)
    spans = [
        span
        for section in split_sections(text, parse_headings=kind != "text")
        for span in recursive_spans(text, section, config, counter)
    ]
    return [text[a:b] for a, b in spans]


def v2_texts(markdown: str, kind: str, config: ChunkConfig, counter: TokenCounter) -> list[str]:
    doc = CleanedDocument("d", "f", "s", kind, "c", markdown, {}, "fp")
    return [c.text for c in chunk_document(doc, kind, config, "fp", counter)]


def table_stats(markdown: str, texts: list[str]) -> dict[str, int]:
    text, _ = strip_page_markers(markdown)
    tables = find_tables(text, 0, len(text))
    holding = with_header = cut = 0
    for table in tables:
        head_lines = text[table.start : table.rows].rstrip("\n").split("\n")
        head_row = head_lines[-2]
        rows = [r for r in text[table.rows : table.end].split("\n") if r.strip()]
        row_set = set(rows)
        for chunk in texts:
            lines = chunk.split("\n")
            full = [line for line in lines if line in row_set]
            partial = [
                line
                for line in lines
                if line.strip() and line not in row_set and line not in head_lines
                and "|" in line and any(line in r for r in rows)
            ]  # fmt: skip
            if not (full or partial):
                continue
            holding += 1
            with_header += head_row in lines
            cut += bool(partial)
    return {"tables": len(tables), "chunks_with_rows": holding, "with_header": with_header,
            "chunks_with_a_cut_row": cut}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path,
                        default=REPO / "bench" / "results" / "table_chunks.json")  # fmt: skip
    args = parser.parse_args()
    config = ChunkConfig()
    counter = TokenCounter(config.tokenizer)
    converter = Converter(ConvertConfig())
    clean = CleanConfig()
    sources: dict[str, tuple[str, str]] = {}
    for name in ("redp5110_sampled.md", "normal_4pages.md"):
        md = (SHARED / "groundtruth" / name).read_text(encoding="utf-8")
        sources[f"groundtruth/{name}"] = ("markdown", clean_markdown(md, clean).markdown)
    with tempfile.TemporaryDirectory() as tmp:
        files = write_long_tables(Path(tmp))
        files["docx"] = write_docx_table(Path(tmp) / "history.docx")
        for kind, path in files.items():
            source = SourceFile(str(path), str(path), tmp, kind, path.stat().st_size,
                                sha256_file(path))  # fmt: skip
            md = converter.convert(source, "fp").markdown
            sources[path.name] = (kind, clean_markdown(md, clean).markdown)
    tables: dict[str, dict[str, dict[str, int]]] = {}
    for name, (kind, md) in sources.items():
        tables[name] = {
            "v1": table_stats(md, v1_texts(md, kind, config, counter)),
            "v2": table_stats(md, v2_texts(md, kind, config, counter)),
        }
        print(name, tables[name])
    totals = {
        v: {k: sum(t[v][k] for t in tables.values()) for k in tables[name][v]} for v in ("v1", "v2")
    }
    print("all tables", totals)

    # Dev sets: chunks identical under v1 and v2?
    debfaq_docs = differ = 0
    with (SHARED / "debfaq" / "corpus.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            title = str(doc.get("title") or "").strip()
            md = (title + "\n" if title else "") + doc["text"]
            debfaq_docs += 1
            differ += v1_texts(md, "markdown", config, counter) != v2_texts(
                md, "markdown", config, counter
            )
    rfaq = SHARED / "rdocs" / "R-FAQ.pdf"
    source = SourceFile(str(rfaq), str(rfaq), str(rfaq.parent), "pdf", rfaq.stat().st_size,
                        sha256_file(rfaq))  # fmt: skip
    rfaq_md = clean_markdown(converter.convert(source, "fp").markdown, clean).markdown
    rfaq_v1 = v1_texts(rfaq_md, "pdf", config, counter)
    rfaq_same = rfaq_v1 == v2_texts(rfaq_md, "pdf", config, counter)
    dev = {
        "debfaq_documents": debfaq_docs,
        "debfaq_documents_chunked_differently": differ,
        "rfaq_chunks": len(rfaq_v1),
        "rfaq_pipe_tables": len(find_tables(rfaq_md, 0, len(rfaq_md))),
        "rfaq_chunks_identical": rfaq_same,
    }
    print("dev sets", dev)
    result = {"chunk_size": config.size, "tables": tables, "totals": totals, "dev_sets": dev}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

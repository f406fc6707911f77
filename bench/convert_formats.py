"""ragpipe's conversion of Docling's model-free formats against raw Docling, per format.

For each sample of tests/support/formats.py (PPTX, XLSX, ODT, EPUB, EML, AsciiDoc,
LaTeX, VTT; one slide, sheet, section or cue each) and the shipped Markdown sample:
``Converter.convert`` (ragpipe: the header checks, the text read, Docling, the Markdown
export) against Docling's own ``DocumentConverter.convert`` + ``export_to_markdown`` on
the same file, interleaved, median of ``--repeat`` runs. Prints the ratio raw ÷ ragpipe
per format (1.0: no overhead; target ≥ 0.9, as for PDFs). Both outputs' Markdown must be
identical (checked).

Results: bench/results/convert_formats.json.

Usage: python bench/convert_formats.py [--repeat 100] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from ragpipe.config import ConvertConfig  # noqa: E402
from ragpipe.ingest.convert import DOCLING_SIMPLE, UNESCAPED, Converter  # noqa: E402
from ragpipe.ingest.discover import sha256_file  # noqa: E402
from ragpipe.schemas import SourceFile  # noqa: E402
from tests.support.formats import write_samples  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--json", type=Path,
                        default=REPO / "bench" / "results" / "convert_formats.json")  # fmt: skip
    args = parser.parse_args()
    from docling.datamodel.base_models import InputFormat
    from docling.document_converter import DocumentConverter

    formats = [InputFormat[name] for name in DOCLING_SIMPLE.values()]
    raw = DocumentConverter(allowed_formats=[*formats, InputFormat.ODS, InputFormat.ODP])
    ours = Converter(ConvertConfig())
    with tempfile.TemporaryDirectory() as tmp:
        samples = write_samples(Path(tmp))
        samples["markdown"] = REPO / "data" / "sample" / "amt_handbook_sample.md"
        rows = []
        for kind, path in samples.items():
            source = SourceFile(str(path), str(path), str(path.parent), kind,
                                path.stat().st_size, sha256_file(path))  # fmt: skip
            raw_md = raw.convert(path).document.export_to_markdown(**UNESCAPED)  # warm both
            our_md = ours.convert(source, "fp").markdown
            assert raw_md == our_md, f"{kind}: ragpipe's Markdown differs from Docling's"
            raw_t, our_t = [], []
            for _ in range(args.repeat):
                started = time.perf_counter()
                raw.convert(path).document.export_to_markdown(**UNESCAPED)
                raw_t.append(time.perf_counter() - started)
                started = time.perf_counter()
                ours.convert(source, "fp")
                our_t.append(time.perf_counter() - started)
            raw_ms, our_ms = statistics.median(raw_t) * 1e3, statistics.median(our_t) * 1e3
            rows.append({"kind": kind, "file": path.name, "raw_ms": round(raw_ms, 3),
                         "ragpipe_ms": round(our_ms, 3), "ratio": raw_ms / our_ms})  # fmt: skip
    print(f"{'format':14s} {'file':26s} {'raw ms':>8s} {'ragpipe ms':>10s} {'raw ÷ ragpipe':>13s}")
    for r in rows:
        print(f"{r['kind']:14s} {r['file']:26s} {r['raw_ms']:8.2f} {r['ragpipe_ms']:10.2f} "
              f"{r['ratio']:13.2f}")  # fmt: skip
    worst = min(r["ratio"] for r in rows)
    print(f"lowest ratio {worst:.2f} (target >= 0.9); Markdown identical for every format")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"repeat": args.repeat, "rows": rows}, indent=1) + "\n",
                         encoding="utf-8")  # fmt: skip


if __name__ == "__main__":
    main()

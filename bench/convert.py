"""Benchmark the fast PDF mode against Docling's raw NativePdfPipeline.

Speed: pages/s of ragpipe's fast mode (Docling native pipeline + structure
recovery) over pages/s of Docling's native pipeline alone, on the same PDFs
in the same run, interleaved, median of ``--repeat`` runs. Target ratio ≥ 0.9.

Fidelity: each output is compared with Docling's model-pipeline Markdown in
``../shared/corpus/groundtruth``: heading recall/precision and token F1.
Targets on the English PDFs: heading recall ≥ 0.8, text F1 ≥ 0.9.

Usage: python bench/convert.py [--repeat 5] [--corpus DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ragpipe.config import ConvertConfig  # noqa: E402
from ragpipe.ingest.convert import Converter  # noqa: E402
from ragpipe.ingest.discover import sha256_file  # noqa: E402
from ragpipe.ingest.fidelity import compare  # noqa: E402
from ragpipe.schemas import SourceFile  # noqa: E402

NON_ENGLISH = {"normal_4pages", "right_to_left_01"}  # Korean, Arabic


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "convert.json")
    args = parser.parse_args()

    from docling.datamodel.base_models import InputFormat
    from docling.datamodel.pipeline_options import NativePdfPipelineOptions
    from docling.document_converter import DocumentConverter, NativePdfFormatOption

    raw = DocumentConverter(
        allowed_formats=[InputFormat.PDF],
        format_options={
            InputFormat.PDF: NativePdfFormatOption(
                pipeline_options=NativePdfPipelineOptions(generate_page_images=False)
            )
        },
    )
    ours = Converter(ConvertConfig())
    pdfs = sorted((args.corpus / "pdf").glob("*.pdf"))
    rdocs = sorted((args.corpus / "rdocs").glob("*.pdf"))
    rows = []
    # Warm-up: imports and first-use initialisation are not what we measure.
    warm = pdfs[0]
    raw.convert(warm)
    ours.convert(SourceFile(str(warm), str(warm), "", "pdf", 0, sha256_file(warm)), "bench")

    for pdf in [*pdfs, *rdocs]:
        source = SourceFile(str(pdf), str(pdf), "", "pdf", pdf.stat().st_size, sha256_file(pdf))
        raw_times, our_times = [], []
        pages = 0
        markdown = ""
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = raw.convert(pdf)
            raw_times.append(time.perf_counter() - t0)
            pages = len(res.pages)
            t0 = time.perf_counter()
            doc = ours.convert(source, "bench")
            our_times.append(time.perf_counter() - t0)
            markdown = doc.markdown
        row: dict[str, object] = {
            "pdf": pdf.name,
            "pages": pages,
            "raw_pages_per_s": pages / statistics.median(raw_times),
            "ours_pages_per_s": pages / statistics.median(our_times),
        }
        row["speed_ratio"] = float(row["ours_pages_per_s"]) / float(row["raw_pages_per_s"])  # type: ignore[arg-type]
        truth = args.corpus / "groundtruth" / f"{pdf.stem}.md"
        if truth.is_file():
            fid = compare(markdown, truth.read_text(encoding="utf-8"))
            row.update(
                heading_recall=fid.heading_recall,
                heading_precision=fid.heading_precision,
                text_f1=fid.text_f1,
                english=pdf.stem not in NON_ENGLISH,
            )
        rows.append(row)

    print(f"{'pdf':28} {'pages':>5} {'raw p/s':>8} {'ours p/s':>8} {'ratio':>6} "
          f"{'h-rec':>6} {'h-prec':>6} {'F1':>6}")  # fmt: skip
    for r in rows:
        fid_cols = (
            f"{r['heading_recall']:6.2f} {r['heading_precision']:6.2f} {r['text_f1']:6.3f}"
            if "text_f1" in r
            else f"{'-':>6} {'-':>6} {'-':>6}"
        )
        print(
            f"{r['pdf']:28} {r['pages']:5d} {r['raw_pages_per_s']:8.1f} "
            f"{r['ours_pages_per_s']:8.1f} {r['speed_ratio']:6.2f} {fid_cols}"
        )
    total_pages = sum(int(r["pages"]) for r in rows)  # type: ignore[call-overload]
    raw_s = sum(int(r["pages"]) / float(r["raw_pages_per_s"]) for r in rows)  # type: ignore[call-overload,arg-type]
    our_s = sum(int(r["pages"]) / float(r["ours_pages_per_s"]) for r in rows)  # type: ignore[call-overload,arg-type]
    english = [r for r in rows if r.get("english")]
    summary = {
        "speed_ratio_overall": raw_s / our_s,
        "pages": total_pages,
        "english_heading_recall_mean": statistics.mean(float(r["heading_recall"]) for r in english),  # type: ignore[arg-type]
        "english_heading_precision_mean": statistics.mean(
            float(r["heading_precision"])
            for r in english  # type: ignore[arg-type]
        ),
        "english_text_f1_mean": statistics.mean(float(r["text_f1"]) for r in english),  # type: ignore[arg-type]
        "english_text_f1_min": min(float(r["text_f1"]) for r in english),  # type: ignore[arg-type]
        "repeat": args.repeat,
    }
    print()
    print(
        f"overall speed ratio (ours/raw, all {total_pages} pages): "
        f"{summary['speed_ratio_overall']:.2f}  (target >= 0.9)"
    )
    print(
        f"English PDFs: heading recall {summary['english_heading_recall_mean']:.2f} "
        f"(target >= 0.8), heading precision {summary['english_heading_precision_mean']:.2f}, "
        f"text F1 mean {summary['english_text_f1_mean']:.3f} / min "
        f"{summary['english_text_f1_min']:.3f} (target >= 0.9)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

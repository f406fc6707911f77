"""Build eval/golden/r-faq-dev.yaml from the R FAQ's own numbered questions.

Converts R-FAQ.pdf with ragpipe's converter (fast mode, as ingest does),
takes every numbered section heading that is a question ("2.7 What
documentation exists for R?"), and writes one golden item per question:

- query: the question without its number;
- chunk target: the chunks under that heading in R-FAQ.pdf (grade 3);
- file relevance: R-FAQ.pdf (grade 3);
- expected_answer: the first sentences of the section (for RAG metrics).

The corpus it is meant for is the six R manuals in ../shared/corpus/rdocs
(R-FAQ.pdf is also in data/sample). Each question also stands verbatim in
the PDF as its heading: the set favours lexical matching.

Usage: python scripts/make_golden_rfaq.py [--pdf PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.evaluation.golden import ChunkTarget, GoldenItem, GoldenSet, save_golden  # noqa: E402
from ragpipe.ingest.clean import clean_markdown  # noqa: E402
from ragpipe.ingest.convert import Converter  # noqa: E402
from ragpipe.ingest.discover import sha256_file  # noqa: E402
from ragpipe.schemas import SourceFile  # noqa: E402

HEADING = re.compile(r"^(#{2,6})\s+((\d+(?:\.\d+)+)\s+(.+\?))\s*$")
PAGE = re.compile(r"<!--.*?-->")


def first_sentences(lines: list[str], limit: int = 300) -> str:
    text = " ".join(PAGE.sub(" ", " ".join(lines)).split())
    text = re.sub(r"```.*?```", " ", text)
    out = ""
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        if not sentence or sentence.startswith("#"):
            continue
        if out and len(out) + len(sentence) > limit:
            break
        out = f"{out} {sentence}".strip()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    default_pdf = REPO / "data" / "sample" / "R-FAQ.pdf"
    parser.add_argument("--pdf", type=Path, default=default_pdf)
    parser.add_argument("--out", type=Path, default=REPO / "eval" / "golden" / "r-faq-dev.yaml")
    args = parser.parse_args()
    cfg = RagpipeConfig()
    source = SourceFile(
        "R-FAQ.pdf", str(args.pdf), "", "pdf", args.pdf.stat().st_size, sha256_file(args.pdf)
    )
    markdown = Converter(cfg.convert).convert(source, "golden").markdown
    cleaned = clean_markdown(markdown, cfg.clean).markdown
    sections: list[tuple[str, str, list[str]]] = []  # (number, heading, body lines)
    for line in cleaned.splitlines():
        match = HEADING.match(line.strip())
        if match:
            sections.append((match.group(3), match.group(2), []))
        elif sections and not line.startswith("#"):
            sections[-1][2].append(line)
        elif sections and line.startswith("#"):
            sections[-1][2].append(line)  # sub-headings belong to the question's section
    items = []
    for number, heading, body in sections:
        question = heading[len(number) :].strip()
        items.append(
            GoldenItem(
                id=f"faq-{number}",
                query=question,
                relevance={"R-FAQ.pdf": 3},
                chunks=(ChunkTarget("R-FAQ.pdf", heading=heading, grade=3),),
                expected_answer=first_sentences(body) or None,
            )
        )
    golden = GoldenSet(
        "r-faq-dev",
        items,
        "The R FAQ's numbered questions; the relevant target is the question's own section "
        "(chunk targets by heading) in R-FAQ.pdf. Corpus: the six R manuals "
        "(../shared/corpus/rdocs) or data/sample. Questions are also headings in the PDF, so "
        "this set favours lexical matching. Built by scripts/make_golden_rfaq.py.",
    )
    save_golden(golden, args.out)
    print(f"wrote {len(items)} questions to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What converting each document in a child process costs (issue 31, convert.timeout_s).

The same files through ``Converter.convert`` in this process and through
``IsolatedConverter`` (a child forked from a fork server that imported
Docling; the document comes back pickled), interleaved, median of
``--repeat`` rounds. Both are warm: the in-process converter has loaded its
pipelines and the child has started (its start is reported apart). Prints
seconds per round and the ratio isolated ÷ in-process.

Usage: python bench/convert_isolation.py [--repeat 5] [--json OUT]
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
from ragpipe.ingest.isolate import IsolatedConverter  # noqa: E402
from ragpipe.schemas import SourceFile  # noqa: E402

KINDS = {".pdf": "pdf", ".md": "markdown", ".html": "html"}


def sources() -> list[SourceFile]:
    files = sorted((REPO / "data" / "sample").iterdir())
    files += sorted((REPO.parent / "shared" / "corpus" / "groundtruth").glob("*.md"))[:6]
    return [
        SourceFile(str(f), str(f), str(f.parent), KINDS[f.suffix], f.stat().st_size,
                   sha256_file(f))
        for f in files
        if f.suffix in KINDS
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    files = sources()
    config = ConvertConfig()
    local = Converter(config)
    started = time.perf_counter()
    isolated = IsolatedConverter(config, timeout_s=600)
    isolated.convert(files[0], "bench")  # starts the fork server and the child
    child_start = time.perf_counter() - started
    for source in files:  # warm both: pipelines loaded
        local.convert(source, "bench")
        isolated.convert(source, "bench")
    rounds: dict[str, list[float]] = {"in_process": [], "isolated": []}
    for _ in range(args.repeat):
        for name, converter in (("in_process", local), ("isolated", isolated)):
            t = time.perf_counter()
            for source in files:
                converter.convert(source, "bench")
            rounds[name].append(time.perf_counter() - t)
    isolated.close()
    med = {name: statistics.median(v) for name, v in rounds.items()}
    result = {
        "files": len(files),
        "bytes": sum(s.size_bytes for s in files),
        "median_s": med,
        "ratio_isolated_over_in_process": med["isolated"] / med["in_process"],
        "first_document_with_child_start_s": child_start,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

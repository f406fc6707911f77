"""The no-op night on an object-storage root against the raw listing, on a real S3-compatible
server on loopback (moto's server, tests/support/s3_server.py).

A bucket of ``--keys`` small text objects is listed once by ragpipe's discover stage (which
downloads and hashes every object: the first night), then, interleaved ``--repeat`` times:

* raw: s3fs's own paginated listing of the prefix (``fs.find(prefix, detail=True)``), on a
  fresh filesystem (no listing cache), the least any tool must do to see a change;
* ragpipe: ``run_discover`` on the unchanged bucket: the listing, the compare against the
  saved state (no download, no hashing), the checkpoint written.

Prints the median of each and the ratio ragpipe ÷ raw (issue 36's target: ≤ 3). The first
night's download rate is printed too (it is the test server's ~2.4 ms per GET, not ours).

Results: bench/results/object_storage.json.

Usage: python bench/object_storage.py [--keys 10000] [--repeat 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.ingest.discover import run_discover  # noqa: E402
from ragpipe.ingest.objects import open_filesystem  # noqa: E402
from tests.support.s3_server import CREDENTIALS, s3_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path,
                        default=REPO / "bench" / "results" / "object_storage.json")  # fmt: skip
    args = parser.parse_args()
    os.environ.update(CREDENTIALS, AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    with s3_server() as s3, tempfile.TemporaryDirectory() as tmp:
        s3.fill("bench-bucket", "kb/", args.keys)
        cfg = RagpipeConfig(
            discover={"roots": [], "object_roots": ["s3://bench-bucket/kb"]},
            object_storage={"endpoint_url": s3.url},
            store={"path": Path(tmp) / "store"},
            paths={"work_dir": Path(tmp) / "work"},
        )
        started = time.perf_counter()
        first = run_discover(cfg)
        first_s = time.perf_counter() - started
        assert first.counts.objects_downloaded == args.keys, first.counts
        raw_t, our_t = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            fs = open_filesystem("s3", cfg.object_storage)
            listed = fs.find("bench-bucket/kb", detail=True)
            raw_t.append(time.perf_counter() - started)
            assert len(listed) == args.keys
            started = time.perf_counter()
            night = run_discover(cfg)
            our_t.append(time.perf_counter() - started)
            assert night.counts.objects_downloaded == 0 and night.counts.seen == args.keys
    raw, ours = statistics.median(raw_t), statistics.median(our_t)
    result = {
        "keys": args.keys,
        "repeat": args.repeat,
        "first_night_s": round(first_s, 2),
        "first_night_per_object_ms": round(1000 * first_s / args.keys, 2),
        "raw_listing_s": round(raw, 3),
        "noop_night_s": round(ours, 3),
        "ratio_noop_over_listing": round(ours / raw, 2),
        "target": "<= 3",
    }
    print(json.dumps(result, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

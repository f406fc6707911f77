"""Benchmark fetching web pages against raw httpx, in one run, on a loopback site.

1. First fetch of N pages (``fetch_pages``: robots.txt, per-request deadline and
   size cap, charset decoding, title, atomic body writes) vs raw
   ``httpx.Client.get`` of the same pages, one after the other.
2. Nightly re-fetch of the same unchanged pages (conditional requests, 304)
   vs raw conditional GETs with the same validators.
3. A no-op nightly ingest of the pages (``run_ingest``: fetch, plan,
   every later stage reused) vs the raw conditional GETs: what a nightly run of
   an unchanged site costs beyond asking the server.

The site is ``tests/web_server.py`` (a threaded loopback server). Ratios are
time(ours) / time(raw), medians of interleaved repeats: these machines are
noisy, absolute times are not stable.

Usage: python bench/fetch.py [--pages 200] [--repeat 3] [--json OUT]
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402

from ragpipe import checkpoint  # noqa: E402
from ragpipe.config import FetchConfig, RagpipeConfig  # noqa: E402
from ragpipe.ingest.discover import DiscoverCounts  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.ingest.runner import WorkDir  # noqa: E402
from ragpipe.web.pages import fetch_pages  # noqa: E402
from tests.support.web_server import Route, html_page, web_site  # noqa: E402

UA = FetchConfig().user_agent


def _routes(n: int) -> dict[str, Route]:
    routes = {"/robots.txt": Route(b"User-agent: *\nDisallow: /private/\n", "text/plain")}
    for i in range(n):
        body = html_page(
            f"Page {i}",
            *(
                (f"Section {j}", f"Paragraph {j} of page {i} says something about topic {i % 17}.")
                for j in range(6)
            ),
        )
        routes[f"/p/{i}"] = Route(body, etag=f'"v{i}"')
    return routes


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def raw_gets(urls: list[str], conditional: bool) -> None:
    with httpx.Client(headers={"User-Agent": UA}, timeout=10.0) as client:
        for i, url in enumerate(urls):
            headers = {"If-None-Match": f'"v{i}"'} if conditional else {}
            response = client.get(url, headers=headers)
            assert response.status_code == (304 if conditional else 200), url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "fetch.json")
    args = parser.parse_args()

    results: dict[str, Any] = {"pages": args.pages}
    with web_site(_routes(args.pages)) as site, tempfile.TemporaryDirectory() as tmp:
        urls = [f"{site.url}/p/{i}" for i in range(args.pages)]
        fetch_cfg = FetchConfig()
        first_ours, first_raw, again_ours, again_raw = [], [], [], []
        for r in range(args.repeat):
            bodies = Path(tmp) / f"bodies-{r}"
            state: list[Any] = []

            def ours_first(bodies: Path = bodies, state: list[Any] = state) -> None:
                result = fetch_pages(fetch_cfg, urls, [], bodies, [])
                assert len(result.files) == args.pages, result.failures[:3]
                state.extend(result.pages)

            def ours_again(bodies: Path = bodies, state: list[Any] = state) -> None:
                result = fetch_pages(fetch_cfg, urls, [], bodies, state)
                assert result.not_modified == args.pages

            first_raw.append(_timed(lambda: raw_gets(urls, conditional=False)))
            first_ours.append(_timed(ours_first))
            again_raw.append(_timed(lambda: raw_gets(urls, conditional=True)))
            again_ours.append(_timed(ours_again))

        # 3. The whole nightly ingest of an unchanged site.
        cfg = RagpipeConfig(
            discover={"roots": [], "urls": urls},
            embed={"provider": "onnx"},
            store={"path": Path(tmp) / "store"},
            paths={"work_dir": Path(tmp) / "work"},
        )
        started = time.perf_counter()
        built = run_ingest(cfg)
        build_s = time.perf_counter() - started
        assert built.added == args.pages, built.line()
        nightly_ours, nightly_raw = [], []
        for _ in range(args.repeat):
            nightly_raw.append(_timed(lambda: raw_gets(urls, conditional=True)))
            started = time.perf_counter()
            summary = run_ingest(cfg)
            nightly_ours.append(time.perf_counter() - started)
            assert summary.skipped_unchanged == args.pages and summary.chunks_written == 0
        manifest = checkpoint.read_manifest(WorkDir.of(cfg).stage("discover"))
        assert manifest is not None
        requests = DiscoverCounts.from_dict(manifest.counts).requests

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    rows = [
        ("first fetch ÷ raw GETs", med(first_ours), med(first_raw)),
        ("re-fetch, all 304 ÷ raw conditional GETs", med(again_ours), med(again_raw)),
        ("no-op nightly ingest ÷ raw conditional GETs", med(nightly_ours), med(nightly_raw)),
    ]
    print(f"{args.pages} pages on a loopback site, medians of {args.repeat} interleaved repeats")
    for name, ours, raw in rows:
        print(f"  {name:45s} {ours / raw:5.2f}x  ({ours:.3f} s vs {raw:.3f} s)")
        results[name] = {"ours_s": ours, "raw_s": raw, "ratio": ours / raw}
    print(f"  first ingest of the pages (convert, embed, upsert): {build_s:.1f} s")
    print(f"  requests in a nightly run: {requests}")
    results["first_ingest_s"] = build_s
    results["nightly_requests"] = requests
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

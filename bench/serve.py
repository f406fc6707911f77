"""`ragpipe serve`: /search over HTTP against the in-process Retriever, in one run (issue 20).

Indexes the sample corpus (``data/sample``, the default embedder; reused under
``--work``, default bench/.cache/serve, on later runs), then:

1. **1 client**: for each query, the in-process ``Retriever.search`` (this
   process, its own published copy and models) and ``POST /search`` to a
   ``ragpipe serve`` subprocess, interleaved, so both see the same machine.
   Prints p50/p95 of each and the ratio of p50s. Target: HTTP ≤ 1.2×.
2. **4 and 16 clients**: threads sending ``POST /search`` back to back
   (keep-alive connections), p50/p95 and requests/s. The server searches one
   request at a time (one open store), so on this machine latency grows with
   the queue; the ratio to the single-client in-process p50 shows by how much.

Queries are the R-FAQ dev questions and the debfaq questions, each made
unique per request (a numbered prefix) so no request hits a query-vector
cache: every request embeds its query, on both sides. The semantic cache is
off for /search (its default). Results: bench/results/serve.json.

Usage: python bench/serve.py [--work DIR] [--requests 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus"
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import yaml  # noqa: E402

from ragpipe.config import load_config  # noqa: E402
from ragpipe.evaluation.golden import load_golden  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402


def questions() -> list[str]:
    rfaq = [i.query for i in load_golden(REPO / "eval" / "golden" / "r-faq-dev.yaml").items]
    with (SHARED / "debfaq" / "queries.jsonl").open(encoding="utf-8") as fh:
        debfaq = [json.loads(line)["text"] for line in fh if line.strip()]
    return rfaq + debfaq


def unique(base: list[str], n: int, offset: int = 0) -> list[str]:
    """``n`` distinct query texts: the questions in turn, each with a numbered prefix."""
    return [f"({offset + i}) {base[i % len(base)]}" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(config_file: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    ragpipe = Path(sys.executable).parent / "ragpipe"
    with log.open("wb") as sink:  # a file, not a pipe: the access log never blocks the server
        process = subprocess.Popen(
            [str(ragpipe), "serve", "--config", str(config_file), "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"ragpipe serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("ragpipe serve did not answer /healthz within 180 s")


def load(url: str, texts: list[str], clients: int) -> tuple[list[float], float]:
    """Latencies (s) of ``texts`` sent by ``clients`` threads, and the wall time."""
    latencies: list[float] = []
    lock = threading.Lock()
    shares = [texts[i::clients] for i in range(clients)]

    def client(share: list[str]) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            for text in share:
                started = time.perf_counter()
                got = http.post("/search", json={"query": text})
                elapsed = time.perf_counter() - started
                if got.status_code != 200:
                    raise SystemExit(f"/search answered {got.status_code}: {got.text[:300]}")
                with lock:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=client, args=(share,)) for share in shares]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench" / ".cache" / "serve")
    parser.add_argument("--requests", type=int, default=300, help="requests per measurement")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "serve.json")
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    config_file = work / "ragpipe.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "discover": {"roots": [str(REPO / "data" / "sample")]},
                "store": {"path": str(work / "store")},
                "paths": {"work_dir": str(work / "work")},
            }
        ),
        encoding="utf-8",
    )
    cfg = load_config(config_file)
    print(run_ingest(cfg).line(), flush=True)
    base = questions()
    port = free_port()
    server = start_server(config_file, port, work / "serve.log")
    url = f"http://127.0.0.1:{port}"
    results: dict[str, Any] = {"queries": len(base), "requests": args.requests}
    try:
        with Retriever(cfg) as retriever, httpx.Client(base_url=url, timeout=120) as http:
            for text in unique(base, 20, offset=10_000):  # warm both sides up
                retriever.search(text)
                http.post("/search", json={"query": text})
            local, remote = [], []
            for text in unique(base, args.requests):
                started = time.perf_counter()
                retriever.search(text)
                local.append(time.perf_counter() - started)
                started = time.perf_counter()
                got = http.post("/search", json={"query": text})
                remote.append(time.perf_counter() - started)
                assert got.status_code == 200, got.text
        p50_local = statistics.median(local)
        results["in_process"] = {"p50_ms": p50_local * 1e3, "p95_ms": percentile(local, 0.95) * 1e3}
        rows = [("in-process Retriever.search", 1, local, None)]
        rows.append(("HTTP POST /search", 1, remote, None))
        results["http"] = {}
        for clients in (1, 4, 16):
            if clients == 1:
                latencies, wall = remote, sum(remote)
            else:
                latencies, wall = load(
                    url, unique(base, args.requests, offset=clients * 100_000), clients
                )
                rows.append(("HTTP POST /search", clients, latencies, wall))
            results["http"][str(clients)] = {
                "p50_ms": statistics.median(latencies) * 1e3,
                "p95_ms": percentile(latencies, 0.95) * 1e3,
                "requests_per_s": len(latencies) / wall,
                "p50_ratio_to_in_process": statistics.median(latencies) / p50_local,
            }
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"\n{len(base)} distinct questions (R-FAQ dev + debfaq), {args.requests} requests each")
    print(
        f"{'path':30s} {'clients':>7s} {'p50 ms':>8s} {'p95 ms':>8s} {'req/s':>7s} "
        f"{'p50 ÷ in-process':>17s}"
    )
    for name, clients, latencies, wall in rows:
        p50 = statistics.median(latencies)
        rate = len(latencies) / (wall if wall else sum(latencies))
        print(
            f"{name:30s} {clients:7d} {p50 * 1e3:8.2f} {percentile(latencies, 0.95) * 1e3:8.2f} "
            f"{rate:7.1f} {p50 / p50_local:17.2f}"
        )
    ratio = results["http"]["1"]["p50_ratio_to_in_process"]
    print(f"\nHTTP p50 ÷ in-process p50 at 1 client: {ratio:.2f} (target ≤ 1.2)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

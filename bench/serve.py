"""`ragpipe serve`: /search over HTTP against the in-process Retriever and the raw floor of a
search, for both query paths (ONNX and torch), in one run (issues 20 and 34).

Indexes the sample corpus (``data/sample``, the default embedder; reused under
``--work``, default bench/.cache/serve, on later runs), then, for each query
runtime (``embed.query_runtime`` onnx, then torch; the index is the same):

1. **1 client**: for each query, the raw floor (ONNX only: onnxruntime embeds
   the query with the same verified graph, then one ``qdrant_edge`` hybrid
   query, two prefetches fused by RRF, on the store the retriever opened; no
   ragpipe code in the timed loop; the BM25 query vectors are computed before
   it), the in-process ``Retriever.search`` (this process, its own published
   copy and models) and ``POST /search`` to a ``ragpipe serve`` subprocess,
   interleaved, so all see the same machine. Prints p50/p95 of each and the
   ratios of p50s. Targets: in-process ≤ 1.5× the raw floor; HTTP ≤ 1.2×
   in-process.
2. **4 and 16 clients**: threads sending ``POST /search`` back to back
   (keep-alive connections), p50/p95 and requests/s. The server searches one
   request at a time (one open store), so latency grows with the queue.
   Target: ONNX throughput at 4 clients ≥ 2.5× torch's.
3. **Same rankings**: every question's top 10 from both in-process paths,
   compared (the dev sets' NDCG on both paths: bench/retrieval_quality.py
   --query-runtime).

The client: requests are sent with the standard library's ``http.client`` on one
keep-alive connection per client thread, the lightest client at hand, so that the
client's own CPU (on the same 2 cores) is not counted as the server's; httpx, which
costs about 1 ms a request more here, is measured too (1 client, interleaved with the
rest, and 4 clients) and printed beside it.

Queries are the R-FAQ dev questions and the debfaq questions, each made
unique per request (a numbered prefix) so no whole query hits a query-vector
cache: every request embeds its query, on both sides. Two known biases:
``retrieve.split_fragments`` also embeds each sentence of the 17 questions
of several sentences, and the later sentences repeat unnumbered, so they can
hit the cache (more often on the server, which sees each question from both
clients); and the httpx client's 1-client texts carry 5-digit numbers
(19.4 word-pieces on average against 17.8), about 0.4 ms more embedding. The semantic cache is
off for /search (its default). Results: bench/results/serve.json.

Usage: python bench/serve.py [--work DIR] [--requests 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import http.client
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
from urllib.parse import urlsplit

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


class Plain:
    """``POST /search`` on one keep-alive connection with the standard library's http.client."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        self.connection = http.client.HTTPConnection(host, parts.port, timeout=120)

    def search(self, text: str) -> tuple[int, str]:
        body = json.dumps({"query": text}).encode()
        self.connection.request(
            "POST", "/search", body=body, headers={"Content-Type": "application/json"}
        )
        reply = self.connection.getresponse()
        return reply.status, reply.read().decode()

    def close(self) -> None:
        self.connection.close()


class Httpx:
    """``POST /search`` with an ``httpx.Client`` (keep-alive)."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=120)

    def search(self, text: str) -> tuple[int, str]:
        got = self.client.post("/search", json={"query": text})
        return got.status_code, got.text

    def close(self) -> None:
        self.client.close()


CLIENTS: dict[str, type[Plain | Httpx]] = {"http.client": Plain, "httpx": Httpx}


def load(
    url: str, texts: list[str], clients: int, kind: str = "http.client"
) -> tuple[list[float], float]:
    """Latencies (s) of ``texts`` sent by ``clients`` threads, and the wall time."""
    latencies: list[float] = []
    lock = threading.Lock()
    shares = [texts[i::clients] for i in range(clients)]

    def client(share: list[str]) -> None:
        sender = CLIENTS[kind](url)
        try:
            for text in share:
                started = time.perf_counter()
                status, body = sender.search(text)
                elapsed = time.perf_counter() - started
                if status != 200:
                    raise SystemExit(f"/search answered {status}: {body[:300]}")
                with lock:
                    latencies.append(elapsed)
        finally:
            sender.close()

    threads = [threading.Thread(target=client, args=(share,)) for share in shares]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - started


class RawFloor:
    """A search with no ragpipe code: tokenizers + onnxruntime (the verified graph of the
    index's embedder, mean pooling, normalised) and one qdrant_edge hybrid query (dense and
    BM25 prefetches fused by RRF) on the shard ``retriever`` opened."""

    def __init__(self, retriever: Retriever, texts: list[str]) -> None:
        import numpy as np
        import onnxruntime as ort
        import qdrant_edge as qe
        from tokenizers import Tokenizer

        from ragpipe.models.embedders import _packaged_minilm
        from ragpipe.models.onnx_query import verified_graph

        model_dir = _packaged_minilm()
        graph, verdict = verified_graph(model_dir)
        if graph is None:
            raise SystemExit(f"no verified ONNX graph for the raw floor: {verdict}")
        self.np, self.qe = np, qe
        settings = json.loads((model_dir / "sentence_bert_config.json").read_text("utf-8"))
        self.lowercase = bool(settings.get("do_lower_case"))
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=int(verdict["max_seq_length"]))  # type: ignore[index]
        self.tokenizer.no_padding()  # tokenizer.json pads to 128: one query needs none
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        store = retriever.store
        self.shard = store._shard  # type: ignore[attr-defined]  # the engine itself
        self.sparse = {t: store._sparse.query(t) for t in texts}  # type: ignore[attr-defined]
        self.prefetch = max(retriever.config.retrieve.prefetch, retriever.config.retrieve.top_k)
        self.top_k = retriever.config.retrieve.top_k

    def search(self, text: str) -> list[Any]:
        np, qe = self.np, self.qe
        encoding = self.tokenizer.encode(text.lower() if self.lowercase else text)
        mask = np.array([encoding.attention_mask], dtype=np.int64)
        feed = {
            "input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": mask,
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
        }
        (tokens,) = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})
        vector = (tokens[0] * mask[0][:, None]).sum(0) / mask.sum()
        vector /= np.linalg.norm(vector)
        indices, values = self.sparse[text]
        return list(
            self.shard.query(
                qe.QueryRequest(
                    limit=self.top_k,
                    prefetches=[
                        qe.Prefetch(
                            limit=self.prefetch,
                            query=qe.Query.Nearest(vector.tolist(), using="dense"),
                        ),
                        qe.Prefetch(
                            limit=self.prefetch,
                            query=qe.Query.Nearest(qe.SparseVector(indices, values), using="bm25"),
                        ),
                    ],
                    query=qe.Fusion.Rrf(k=61),
                    with_payload=True,
                )
            )
        )


def write_config(work: Path, runtime: str) -> Path:
    config_file = work / f"ragpipe-{runtime}.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "discover": {"roots": [str(REPO / "data" / "sample")]},
                "store": {"path": str(work / "store")},
                "paths": {"work_dir": str(work / "work")},
                "embed": {"query_runtime": runtime},
            }
        ),
        encoding="utf-8",
    )
    return config_file


def stats(latencies: list[float], wall: float | None = None) -> dict[str, float]:
    return {
        "p50_ms": statistics.median(latencies) * 1e3,
        "p95_ms": percentile(latencies, 0.95) * 1e3,
        "requests_per_s": len(latencies) / (wall if wall else sum(latencies)),
    }


def measure(work: Path, runtime: str, base: list[str], requests: int) -> dict[str, Any]:
    """One query path: raw floor (onnx only), in-process, HTTP at 1, 4 and 16 clients."""
    config_file = write_config(work, runtime)
    cfg = load_config(config_file)
    port = free_port()
    server = start_server(config_file, port, work / f"serve-{runtime}.log")
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    texts = unique(base, requests)
    texts_httpx = unique(base, requests, offset=50_000)
    plain, other = Plain(url), Httpx(url)
    try:
        with Retriever(cfg) as retriever:
            floor = (
                RawFloor(retriever, texts + unique(base, 20, 10_000)) if runtime == "onnx" else None
            )
            for text in unique(base, 20, offset=10_000):  # warm every side up
                retriever.search(text)
                plain.search(text)
                other.search(text + "?")
                if floor:
                    floor.search(text)
            raw: list[float] = []
            local: list[float] = []
            remote: list[float] = []
            remote_httpx: list[float] = []
            for i, text in enumerate(texts):
                if floor:
                    started = time.perf_counter()
                    floor.search(text)
                    raw.append(time.perf_counter() - started)
                started = time.perf_counter()
                retriever.search(text)
                local.append(time.perf_counter() - started)
                # Each client goes first in turn; each sends its own texts (the server
                # caches query vectors by text).
                turns: list[tuple[Plain | Httpx, list[float], str]] = [
                    (plain, remote, text),
                    (other, remote_httpx, texts_httpx[i]),
                ]
                for sender, times, sent in turns if i % 2 else turns[::-1]:
                    started = time.perf_counter()
                    status, body = sender.search(sent)
                    times.append(time.perf_counter() - started)
                    assert status == 200, body
            out["top10"] = {
                q: [h.point_id for h in retriever.search(q, top_k=10).hits] for q in base
            }
        if raw:
            out["raw_floor"] = stats(raw)
        out["in_process"] = stats(local)
        out["http"] = {"1": stats(remote)}
        out["http_httpx"] = {"1": stats(remote_httpx)}
        for clients in (4, 16):
            latencies, wall = load(url, unique(base, requests, offset=clients * 100_000), clients)
            out["http"][str(clients)] = stats(latencies, wall)
        latencies, wall = load(url, unique(base, requests, offset=900_000), 4, "httpx")
        out["http_httpx"]["4"] = stats(latencies, wall)
    finally:
        plain.close()
        other.close()
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench" / ".cache" / "serve")
    parser.add_argument("--requests", type=int, default=300, help="requests per measurement")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "serve.json")
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(run_ingest(load_config(write_config(work, "torch"))).line(), flush=True)
    base = questions()
    results: dict[str, Any] = {"queries": len(base), "requests": args.requests}
    for runtime in ("onnx", "torch"):
        print(f"measuring the {runtime} query path ...", flush=True)
        results[runtime] = measure(work, runtime, base, args.requests)
    onnx, torch = results["onnx"], results["torch"]
    same = sum(onnx["top10"][q] == torch["top10"][q] for q in base)
    results["same_top10"] = same
    for side in (onnx, torch):
        del side["top10"]
    floor = onnx["raw_floor"]["p50_ms"]
    print(f"\n{len(base)} distinct questions (R-FAQ dev + debfaq), {args.requests} requests each")
    print(
        f"{'query path':7s} {'what':28s} {'clients':>7s} {'p50 ms':>8s} {'p95 ms':>8s} "
        f"{'req/s':>7s} {'p50 ÷ raw floor':>16s}"
    )
    for runtime in ("onnx", "torch"):
        side = results[runtime]
        rows = [("raw floor (no ragpipe)", 1, side.get("raw_floor"))]
        rows.append(("in-process Retriever.search", 1, side["in_process"]))
        rows += [("HTTP POST /search", int(c), side["http"][c]) for c in ("1", "4", "16")]
        rows += [("HTTP, httpx client", int(c), side["http_httpx"][c]) for c in ("1", "4")]
        for name, clients, row in rows:
            if row is None:
                continue
            print(
                f"{runtime:7s} {name:28s} {clients:7d} {row['p50_ms']:8.2f} {row['p95_ms']:8.2f} "
                f"{row['requests_per_s']:7.1f} {row['p50_ms'] / floor:16.2f}"
            )
    in_process = onnx["in_process"]["p50_ms"] / floor
    http = onnx["http"]["1"]["p50_ms"] / onnx["in_process"]["p50_ms"]
    gain = onnx["http"]["4"]["requests_per_s"] / torch["http"]["4"]["requests_per_s"]
    http_x = onnx["http_httpx"]["1"]["p50_ms"] / onnx["in_process"]["p50_ms"]
    gain_x = onnx["http_httpx"]["4"]["requests_per_s"] / torch["http_httpx"]["4"]["requests_per_s"]
    results["ratios"] = {
        "onnx_in_process_to_raw_floor": in_process,
        "onnx_http_to_in_process": http,
        "throughput_4_clients_onnx_to_torch": gain,
        "httpx_client": {
            "onnx_http_to_in_process": http_x,
            "throughput_4_clients_onnx_to_torch": gain_x,
        },
    }
    print(f"\nin-process p50 ÷ raw floor p50 (onnx): {in_process:.2f} (target ≤ 1.5)")
    print(
        f"HTTP p50 ÷ in-process p50 at 1 client (onnx): {http:.2f} (target ≤ 1.2); "
        f"with the httpx client {http_x:.2f}"
    )
    print(
        f"throughput at 4 clients, onnx ÷ torch: {gain:.2f} (target ≥ 2.5); "
        f"with httpx clients {gain_x:.2f}"
    )
    print(f"same top 10 on both paths: {same} of {len(base)} questions")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

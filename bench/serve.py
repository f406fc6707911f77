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
   interleaved, so all see the same machine, in every order in turn (each side
   goes first as often and follows each other side as often; until 2026-12-02
   the order was fixed, the in-process search right after the raw floor's in
   the same process, which left it a warmer CPU cache than HTTP had). Prints p50/p95 of each and the
   ratios of p50s. Targets: in-process ≤ 1.5× the raw floor; HTTP ≤ 1.2×
   in-process.
2. **4 and 16 clients**: threads sending ``POST /search`` back to back
   (keep-alive connections), p50/p95 and requests/s. Both servers (onnx and
   torch) are up for this phase, and each load goes to each in turn, for
   ``--rounds`` rounds (the runtimes taking turns to go first), so a noisy
   moment of the machine falls on one round of one side, not on a whole side:
   requests/s is each side's median round, latencies are pooled, and the
   throughput ratio is the median of the rounds' own ratios (each round's two
   sides ran back to back). The server searches one request at a time (one
   open store), so latency grows with the queue. While one server is measured
   the other is up and idle (so in phase 1 too). Target: ONNX throughput at
   4 clients ≥ 2.5× torch's.
3. **Same rankings**: every question's top 10 from both in-process paths,
   compared (the dev sets' NDCG on both paths: bench/retrieval_quality.py
   --query-runtime).

The client: requests are sent with the standard library's ``http.client`` on one
keep-alive connection per client thread, the lightest client at hand, so that the
client's own CPU (on the same 2 cores) is not counted as the server's; httpx, which
costs about 1 ms a request more here, is measured too (1 client, interleaved with the
rest, and 4 clients) and printed beside it.

Queries are the R-FAQ dev questions and the debfaq questions, each sentence of
each made unique per request (the request's number before it), so no query and
no sentence ``retrieve.split_fragments`` embeds on its own hits a query-vector
cache: every request embeds all of its texts, on every side (checked before the
run). The httpx client's texts carry the same numbers in other marks (``[n]``
for ``(n)``), so they are as long in word-pieces. The semantic cache is off for
/search (its default). Results: bench/results/serve.json.

Usage: python bench/serve.py [--work DIR] [--requests 300] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import http.client
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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
from ragpipe.query.retrieve import Retriever, split_fragments  # noqa: E402


def questions() -> list[str]:
    rfaq = [i.query for i in load_golden(REPO / "eval" / "golden" / "r-faq-dev.yaml").items]
    with (SHARED / "debfaq" / "queries.jsonl").open(encoding="utf-8") as fh:
        debfaq = [json.loads(line)["text"] for line in fh if line.strip()]
    return rfaq + debfaq


def unique(base: list[str], n: int, offset: int = 0, marks: str = "()") -> list[str]:
    """``n`` distinct query texts: the questions in turn, each of their sentences with the
    request's number in ``marks`` before it, so that neither a whole query nor one of its
    sentences (``retrieve.split_fragments`` also embeds each sentence of a question of
    several) repeats: every request embeds all of its texts, on every side. Clients given
    other ``marks`` send texts of the same length in word-pieces that are still distinct."""
    opening, closing = marks[0], marks[1]
    texts = []
    for i in range(n):
        question, tag = base[i % len(base)], f"{opening}{offset + i}{closing} "
        cuts = [0, *sentence_starts(question)[1:], len(question)]
        texts.append("".join(tag + question[a:b] for a, b in itertools.pairwise(cuts)))
    return texts


@functools.cache
def sentence_starts(question: str) -> list[int]:
    import nupunkt  # the splitter retrieve.split_fragments uses

    return [start for start, _ in nupunkt.sent_spans(question)] or [0]


def check_unique(texts: list[str]) -> None:
    """Refuse a run whose texts would hit a query-vector cache: a text or one of the
    fragments ragpipe would embed for it, twice."""
    seen: set[str] = set()
    for text in texts:
        for part in [text.strip(), *split_fragments(text)]:
            if part in seen:
                raise SystemExit(f"bench/serve.py: {part!r} would be embedded twice")
            seen.add(part)


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


def measure(work: Path, runtime: str, base: list[str], requests: int, url: str) -> dict[str, Any]:
    """One query path at 1 client: raw floor (onnx only), in-process, HTTP (both clients)."""
    cfg = load_config(write_config(work, runtime))
    out: dict[str, Any] = {}
    texts = unique(base, requests)
    texts_httpx = unique(base, requests, marks="[]")  # same numbers, other marks
    plain, other = Plain(url), Httpx(url)
    try:
        with Retriever(cfg) as retriever:
            floor = (
                RawFloor(retriever, texts + unique(base, 20, 10_000)) if runtime == "onnx" else None
            )
            warm = unique(base, 20, offset=10_000)
            for text, text_x in zip(warm, unique(base, 20, 10_000, "[]"), strict=True):
                retriever.search(text)  # warm every side up
                plain.search(text)
                other.search(text_x)
                if floor:
                    floor.search(text)
            raw: list[float] = []
            local: list[float] = []
            remote: list[float] = []
            remote_httpx: list[float] = []

            def over_http(sender: Plain | Httpx, sent: str) -> None:
                status, body = sender.search(sent)
                assert status == 200, body

            # The sides run in every order in turn (all permutations, one a query), so each
            # goes first as often and follows each other side as often: a search leaves the
            # CPU's caches to whoever comes next (the embedder's weights are 90 MB), and a
            # fixed order (the in-process search always right after the raw floor's, in the
            # same process; HTTP after both) favoured some sides. Each HTTP client sends its
            # own texts (the server caches query vectors by text).
            orders = list(itertools.permutations(range(4 if floor else 3)))
            for i, text in enumerate(texts):
                turns: list[tuple[Callable[[], Any], list[float]]] = [
                    (functools.partial(retriever.search, text), local),
                    (functools.partial(over_http, plain, text), remote),
                    (functools.partial(over_http, other, texts_httpx[i]), remote_httpx),
                ]
                if floor:
                    turns.insert(0, (functools.partial(floor.search, text), raw))
                for search, times in (turns[k] for k in orders[i % len(orders)]):
                    started = time.perf_counter()
                    search()
                    times.append(time.perf_counter() - started)
            out["top10"] = {
                q: [h.point_id for h in retriever.search(q, top_k=10).hits] for q in base
            }
    finally:
        plain.close()
        other.close()
    if raw:
        out["raw_floor"] = stats(raw)
    out["in_process"] = stats(local)
    out["http"] = {"1": stats(remote)}
    out["http_httpx"] = {"1": stats(remote_httpx)}
    return out


# The loads of phase 2, each sent to both servers in every round: (client, clients).
LOADS = (("http.client", 4), ("http.client", 16), ("httpx", 4))


def load_texts(base: list[str], requests: int, rounds: int) -> dict[tuple[int, int], list[str]]:
    """Each (round, load)'s texts, distinct from each other and from phase 1's."""
    return {
        (r, n): unique(base, requests, offset=1_000_000 + (r * len(LOADS) + n) * requests)
        for r in range(rounds)
        for n in range(len(LOADS))
    }


def load_phase(
    urls: dict[str, str], base: list[str], requests: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """Every load on both servers, round after round, the runtimes taking turns to go
    first, so that both see the same machine; per load and runtime, the latencies of all
    rounds pooled and each round's requests/s (the median is reported)."""
    texts = load_texts(base, requests, rounds)
    latencies: dict[tuple[str, int], list[float]] = {}
    rates: dict[tuple[str, int], list[float]] = {}
    order = list(urls)
    for r in range(rounds):
        print(f"  load round {r + 1} of {rounds}", flush=True)
        for n, (kind, clients) in enumerate(LOADS):
            for runtime in order if r % 2 == 0 else order[::-1]:
                got, wall = load(urls[runtime], texts[r, n], clients, kind)
                latencies.setdefault((runtime, n), []).extend(got)
                rates.setdefault((runtime, n), []).append(len(got) / wall)
    out: dict[str, dict[str, Any]] = {runtime: {"http": {}, "http_httpx": {}} for runtime in urls}
    for (runtime, n), pooled in latencies.items():
        kind, clients = LOADS[n]
        row: dict[str, Any] = stats(pooled)
        row["requests_per_s"] = statistics.median(rates[runtime, n])
        row["requests_per_s_rounds"] = [round(x, 3) for x in rates[runtime, n]]  # for ratios
        out[runtime]["http" if kind == "http.client" else "http_httpx"][str(clients)] = row
    return out


def paired_ratios(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """Each round's requests/s of ``a`` ÷ ``b``: the two sides of a round ran back to back,
    so a noisy moment of the machine falls on both or on one round only. Their median is
    the reported ratio (a ratio of the two sides' median rounds would pair rounds that did
    not run together)."""
    return [x / y for x, y in zip(a["requests_per_s_rounds"], b["requests_per_s_rounds"],
                                  strict=True)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench" / ".cache" / "serve")
    parser.add_argument("--requests", type=int, default=300, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the load phase")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "serve.json")
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(run_ingest(load_config(write_config(work, "torch"))).line(), flush=True)
    base = questions()
    n = args.requests
    check_unique(  # everything each server is sent
        [*unique(base, 20, 10_000), *unique(base, 20, 10_000, "[]"), *unique(base, n),
         *unique(base, n, marks="[]"), *itertools.chain(*load_texts(base, n, args.rounds).values())]
    )  # fmt: skip
    results: dict[str, Any] = {"queries": len(base), "requests": n, "rounds": args.rounds}
    runtimes = ("onnx", "torch")
    urls, servers = {}, []
    try:
        for runtime in runtimes:  # both up: the load phase sends to each in turn
            port = free_port()
            log = work / f"serve-{runtime}.log"
            servers.append(start_server(write_config(work, runtime), port, log))
            urls[runtime] = f"http://127.0.0.1:{port}"
        for runtime in runtimes:
            print(f"measuring the {runtime} query path at 1 client ...", flush=True)
            results[runtime] = measure(work, runtime, base, n, urls[runtime])
        print(f"both servers under load, {args.rounds} rounds ...", flush=True)
        for runtime, loaded in load_phase(urls, base, n, args.rounds).items():
            for kind, rows in loaded.items():
                results[runtime][kind].update(rows)
    finally:
        for server in servers:
            server.send_signal(signal.SIGINT)
        for server in servers:
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
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
    http_x = onnx["http_httpx"]["1"]["p50_ms"] / onnx["in_process"]["p50_ms"]
    per_round = paired_ratios(onnx["http"]["4"], torch["http"]["4"])
    per_round_x = paired_ratios(onnx["http_httpx"]["4"], torch["http_httpx"]["4"])
    gain, gain_x = statistics.median(per_round), statistics.median(per_round_x)
    results["ratios"] = {
        "onnx_in_process_to_raw_floor": in_process,
        "onnx_http_to_in_process": http,
        "throughput_4_clients_onnx_to_torch": gain,
        "throughput_4_clients_onnx_to_torch_rounds": [round(x, 2) for x in per_round],
        "httpx_client": {
            "onnx_http_to_in_process": http_x,
            "throughput_4_clients_onnx_to_torch": gain_x,
            "throughput_4_clients_onnx_to_torch_rounds": [round(x, 2) for x in per_round_x],
        },
    }
    print(f"\nin-process p50 ÷ raw floor p50 (onnx): {in_process:.2f} (target ≤ 1.5)")
    print(
        f"HTTP p50 ÷ in-process p50 at 1 client (onnx): {http:.2f} (target ≤ 1.2); "
        f"with the httpx client {http_x:.2f}"
    )
    print(
        f"throughput at 4 clients, onnx ÷ torch: {gain:.2f} (target ≥ 2.5; the median of "
        f"{args.rounds} rounds' ratios, each round's two sides measured back to back; round "
        f"by round {min(per_round):.2f}-{max(per_round):.2f}); with httpx clients "
        f"{gain_x:.2f} ({min(per_round_x):.2f}-{max(per_round_x):.2f})"
    )
    print(f"same top 10 on both paths: {same} of {len(base)} questions")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

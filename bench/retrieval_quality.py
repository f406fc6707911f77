"""Retrieval quality on both dev sets, against the peer recipes, in one run.

Dev sets:

- ``debfaq``: the Debian FAQ as a BEIR set (``../shared/corpus/debfaq``; 143
  sections, 116 real questions whose heading was removed from the answer).
  Semantic: the question's words are mostly not in its answer. File
  granularity (a document is a section).
- ``r-faq``: the R FAQ's numbered questions (``eval/golden/r-faq-dev.yaml``)
  over the sample corpus (``data/sample``). Lexical: every answer sits under
  its question as a heading. Chunk granularity (the question's own section).

Peer recipes, computed here from the raw texts with no ragpipe code on the
scoring path: all-MiniLM-L6-v2 cosine (sentence-transformers, whole
documents for debfaq, i.e. their first 256 word-pieces; ragpipe's chunk
texts without prefix for r-faq), BM25Okapi (rank-bm25, lowercase word
tokens), unweighted RRF k=60 of those two, and min-max convex fusion 0.7 ·
dense + 0.3 · BM25 over all documents (the shared corpus README's recipe).
Metrics (NDCG@10, MRR, Recall@10) come from pytrec_eval for every row,
ragpipe's included (its ranked lists are handed over as runs).

In a MiniLM run the raw all-mpnet-base-v2 recipe (whole-document cosine, and its convex
fusion with BM25) is computed too, from the same texts.

ragpipe rows: the shipped default, its dense leg and its sparse leg alone
(``mode``), the previous default (RRF k=60, no document signal), dense
pseudo-relevance feedback (``retrieve.prf``, at its default k and weight), and, in a
MiniLM run, the options that need an index of their own: ``chunk.whole_sections`` and
the quality profile (all-mpnet-base-v2 with ``ragpipe.quality.yaml``'s settings), each
built under ``--work`` once; and the
configuration ``ragpipe eval tune`` picks on each set (tuned on one seeded
half of the queries; its row is scored on all queries, and the held-out
half's paired delta against the default is printed beside it).

Targets (issue 15): debfaq default NDCG@10 ≥ 0.76 and ≥ raw whole-document
MiniLM; r-faq default ≥ 0.96; on each set the default ≥ its own dense leg.

Indexes are built once under ``--work`` (incremental re-runs are no-ops).

With ``--embedder all-mpnet-base-v2`` every row (ragpipe's and the raw recipes) uses that
packaged model, and ragpipe's chunks are measured with its tokenizer and window (as
``ragpipe.quality.yaml`` sets them); indexes go under ``--work``/NAME.

LLM reranking (``retrieve.rerank: llm``) costs seconds a candidate, so it is measured on a
sample of both sets' queries by ``bench/llm_rerank.py``, on these same indexes. The two
whole-section designs with a second vector per chunk need section vectors:
``bench/section_evidence.py`` measures them (and ``chunk.whole_sections`` with mpnet, and
what ``eval tune --ingest-options`` decides) on both sets.

Usage: python bench/retrieval_quality.py [--work DIR] [--json OUT] [--no-tune]
       [--no-peers] [--no-other-indexes]
       [--variant NAME:key=value,...] [--embedder all-mpnet-base-v2]
       [--chunk key=value,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus"
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytrec_eval  # noqa: E402
import yaml  # noqa: E402

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.evaluation.golden import GoldenSet, import_beir, load_golden  # noqa: E402
from ragpipe.evaluation.retrieval import (  # noqa: E402
    Granularity,
    Variant,
    judged,
    parse_variant,
    run_retrieval_eval,
)
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.query.results import Retrieved  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402
from ragpipe.store import VectorStore  # noqa: E402

MEASURES = {"ndcg_cut_10": "ndcg@10", "recip_rank": "mrr", "recall_10": "recall@10"}
Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]


@dataclass
class DevSet:
    name: str
    config: RagpipeConfig
    golden: GoldenSet
    granularity: Granularity
    qrels: Qrels


def build(
    work: Path, embedder: str | None = None, chunk: dict[str, Any] | None = None
) -> list[DevSet]:
    work = work.resolve()  # the index keys files by absolute path
    if embedder:
        work = work / embedder
    if chunk:
        work = work / ("chunk-" + ",".join(f"{k}={v}" for k, v in sorted(chunk.items())))
    sets = []
    beir = work / "debfaq"
    golden = import_beir(SHARED / "debfaq", beir / "corpus")
    cfg = _config(beir, [beir / "corpus"], embedder, chunk)
    print(run_ingest(cfg).line(), flush=True)
    qrels = {i.id: dict(i.relevance) for i in golden.items}
    sets.append(DevSet("debfaq", cfg, golden, Granularity.FILE, qrels))
    rfaq = load_golden(REPO / "eval" / "golden" / "r-faq-dev.yaml")
    cfg = _config(work / "r-faq", [REPO / "data" / "sample"], embedder, chunk)
    print(run_ingest(cfg).line(), flush=True)
    qrels = {i.id: {t.key: t.grade for t in i.chunks} for i in rfaq.items}
    sets.append(DevSet("r-faq", cfg, rfaq, Granularity.CHUNK, qrels))
    return sets


def _config(
    home: Path, roots: list[Path], embedder: str | None = None, chunk: dict[str, Any] | None = None
) -> RagpipeConfig:
    """The shipped defaults; with ``embedder`` (a packaged model), that model for chunk
    measuring and embedding (its tokenizer, its window), and for the quality profile's model
    the profile's retrieval settings, as ragpipe.quality.yaml sets them; ``chunk``: chunk
    settings over those."""
    data: dict[str, Any] = {
        "discover": {"roots": [str(r) for r in roots]},
        "paths": {"work_dir": str(home / "work")},
        "store": {"path": str(home / "store")},
    }
    if embedder:
        from ragpipe.models.packaged_embedder import PACKAGED_EMBEDDERS

        window = PACKAGED_EMBEDDERS[embedder].window
        data["embed"] = {"model": embedder}
        data["chunk"] = {"tokenizer": embedder, "max_tokens": window}
        profile = yaml.safe_load((REPO / "ragpipe.quality.yaml").read_text(encoding="utf-8"))
        if profile["embed"]["model"] == embedder:  # its retrieval settings too
            data["retrieve"] = profile.get("retrieve", {})
    data["chunk"] = {**data.get("chunk", {}), **(chunk or {})}
    return RagpipeConfig.model_validate(data)


def score(run: Run, qrels: Qrels) -> dict[str, float]:
    """Mean NDCG@10, MRR, Recall@10 over every golden query (pytrec_eval)."""
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, set(MEASURES))
    per_query = evaluator.evaluate(run)
    out = {}
    for measure, name in MEASURES.items():
        # A query with no retrieved document scores 0; it does not drop out.
        out[name] = sum(per_query.get(q, {}).get(measure, 0.0) for q in qrels) / len(qrels)
    return out


def as_run(ranked: dict[str, list[str]]) -> Run:
    """Ranked ids as a trec run: strictly decreasing scores keep the order."""
    return {q: {d: 1.0 / (i + 1) for i, d in enumerate(ids)} for q, ids in ranked.items()}


# -- peer recipes -------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def peers(dev: DevSet, store: VectorStore) -> dict[str, Run]:
    """Raw cosine of the run's embedder, raw BM25Okapi, RRF and min-max convex fusion of the
    two, over all documents; in a MiniLM run, also the raw all-mpnet-base-v2 recipe (cosine
    and convex fusion), the stronger packaged embedder's plain baseline."""
    from rank_bm25 import BM25Okapi
    from sentence_transformers import SentenceTransformer

    from ragpipe.models.embedders import local_model_dir

    ids, texts, chunks = _documents(dev, store)
    queries = [item.query for item in dev.golden.items]

    def cosine(name: str | None) -> np.ndarray:
        model = SentenceTransformer(str(local_model_dir(name)), device="cpu")
        docs = model.encode(texts, batch_size=32, normalize_embeddings=True)
        return model.encode(queries, batch_size=32, normalize_embeddings=True) @ docs.T

    dense = cosine(dev.config.embed.model)
    bm25 = BM25Okapi([_tokens(t) for t in texts])
    sparse = np.stack([bm25.get_scores(_tokens(q)) for q in queries])
    rrf = _rrf(dense) + _rrf(sparse)
    convex = 0.7 * _minmax(dense) + 0.3 * _minmax(sparse)
    recipes = [
        (f"raw {_short(dev.config.embed.model)} cosine", dense),
        ("raw BM25Okapi", sparse),
        (f"raw RRF k=60 ({_short(dev.config.embed.model)} + BM25)", rrf),
        ("raw convex 0.7/0.3 min-max", convex),
    ]
    if dev.config.embed.model is None:
        mpnet = cosine(MPNET)
        fused = 0.7 * _minmax(mpnet) + 0.3 * _minmax(sparse)
        recipes += [
            (f"raw {MPNET} cosine", mpnet),
            (f"raw convex 0.7/0.3 min-max ({MPNET} + BM25)", fused),
        ]
    out = {}
    for name, matrix in recipes:
        ranked = {}
        for row, item in zip(matrix, dev.golden.items, strict=True):
            order = sorted(range(len(ids)), key=lambda j: (-row[j], ids[j], j))
            if chunks:  # r-faq: scored by ragpipe's own rule, every chunk at its own rank
                ranked[item.id], _ = judged(
                    [chunks[j] for j in order[:100]], item, Granularity.CHUNK
                )
            else:  # debfaq: whole documents, each once
                ranked[item.id] = list(dict.fromkeys(ids[j] for j in order))[:100]
        out[name] = as_run(ranked)
    return out


def _documents(dev: DevSet, store: VectorStore) -> tuple[list[str], list[str], list[Retrieved]]:
    """Ids, texts and (r-faq) the chunks themselves. debfaq: the BEIR corpus as given, no
    chunks. r-faq: the indexed chunks, scored as ragpipe's rows are (``retrieval.judged``:
    each chunk keeps its rank, credited to the highest-grade target it satisfies that no
    better-ranked chunk took)."""
    if dev.name == "debfaq":
        ids, texts = [], []
        with (SHARED / "debfaq" / "corpus.jsonl").open(encoding="utf-8") as fh:
            for line in fh:
                doc = json.loads(line)
                name = "".join(c if c.isalnum() or c in "-_." else "_" for c in doc["_id"])
                ids.append(name + ".md")
                title = str(doc.get("title") or "").strip()
                texts.append((title + "\n" if title else "") + doc["text"])
        # The names import_beir gave the documents (it hashes a name another id took; none
        # does in debfaq): a peer's ranked id must be the file the golden set names.
        imported = {f.name for f in (dev.config.discover.roots[0]).glob("*.md")}
        if set(ids) != imported or len(ids) != len(imported):
            raise SystemExit("bench: debfaq ids differ from the files import_beir wrote")
        return ids, texts, []
    chunks = [
        Retrieved(hit.point_id, 0.0, hit.payload)
        for hit in sorted(store.scroll(), key=lambda h: h.point_id)
    ]
    return [c.point_id for c in chunks], [c.text for c in chunks], chunks


def _short(model: str | None) -> str:
    return "MiniLM" if model is None else model


def _rrf(matrix: np.ndarray, k: int = 60) -> np.ndarray:
    ranks = np.argsort(np.argsort(-matrix, axis=1, kind="stable"), axis=1) + 1
    return 1.0 / (k + ranks)


def _minmax(matrix: np.ndarray) -> np.ndarray:
    low = matrix.min(axis=1, keepdims=True)
    high = matrix.max(axis=1, keepdims=True)
    return (matrix - low) / np.where(high > low, high - low, 1.0)


# -- ragpipe rows -------------------------------------------------------------------

MPNET = "all-mpnet-base-v2"
RAGPIPE_VARIANTS = [
    Variant("ragpipe default"),
    Variant("ragpipe dense leg", {"mode": "dense"}),
    Variant("ragpipe sparse leg", {"mode": "sparse"}),
    Variant("ragpipe RRF k=60, no doc signal", {"fusion_method": "rrf", "doc_weight": 0.0}),
    Variant("ragpipe + prf (retrieve.prf)", {"prf": True}),
]


def ragpipe_runs(dev: DevSet, variants: list[Variant], retriever: Retriever) -> dict[str, Run]:
    result = run_retrieval_eval(
        dev.config,
        dev.golden,
        variants,
        granularity=dev.granularity,
        depth=10,
        resamples=200,
        retriever=retriever,
    )
    ranked: dict[str, dict[str, list[str]]] = {}
    for row in result.rows:
        ranked.setdefault(row.variant, {})[row.item_id] = row.retrieved
    return {name: as_run(r) for name, r in ranked.items()}


def tuned(dev: DevSet, retriever: Retriever) -> tuple[Variant, str]:
    from ragpipe.evaluation.tune import run_tune

    outcome = run_tune(
        dev.config, dev.golden, granularity=dev.granularity, retriever=retriever, seed=0
    )
    ci = outcome.delta.interval
    before, after = outcome.means()
    note = (
        f"held-out half: {outcome.metric} {before:.3f} -> {after:.3f}, "
        f"delta {ci.mean:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}], "
        f"p={outcome.delta.p_value:.3f}; {outcome.decision}; {len(outcome.trials)} trials"
    )
    return Variant("ragpipe tuned (eval tune)", outcome.overrides), note


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=REPO / "bench" / ".cache" / "quality")
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "results" / "retrieval_quality.json"
    )
    parser.add_argument("--no-tune", action="store_true", help="skip the eval tune row")
    parser.add_argument("--no-peers", action="store_true", help="skip the peer recipes")
    parser.add_argument("--no-other-indexes", action="store_true",
                        help="skip the rows that need their own index (whole sections, the "
                        "quality profile's mpnet)")  # fmt: skip
    parser.add_argument(
        "--variant", action="append", default=[], help="extra ragpipe row, NAME:key=value,..."
    )
    parser.add_argument("--embedder", default=None,
                        help="a packaged embedder for every row (all-mpnet-base-v2); default "
                        "MiniLM")  # fmt: skip
    parser.add_argument("--chunk", default="",
                        help="chunk settings for every index, key=value,... (indexes built "
                        "apart, under --work/chunk-...); e.g. whole_sections=true")  # fmt: skip
    parser.add_argument("--query-runtime", choices=["auto", "onnx", "torch"], default="auto",
                        help="how queries are embedded (embed.query_runtime)")  # fmt: skip
    args = parser.parse_args()
    results: dict[str, Any] = {}
    started = time.perf_counter()
    chunk = {}
    for part in filter(None, (p.strip() for p in args.chunk.split(","))):
        key, _, value = part.partition("=")
        chunk[key.strip()] = yaml.safe_load(value)
    # Options that need an index of their own, scored in the same run (default run only).
    others: dict[str, dict[str, DevSet]] = {}
    if not args.embedder and not chunk and not args.no_other_indexes:
        sections = build(args.work, None, {"whole_sections": True})
        others["ragpipe + chunk.whole_sections (own index)"] = {d.name: d for d in sections}
        profile = build(args.work, MPNET)
        others["ragpipe quality profile (mpnet, own index)"] = {d.name: d for d in profile}
    for dev in build(args.work, args.embedder, chunk):
        embed = dev.config.embed.model_copy(update={"query_runtime": args.query_runtime})
        dev = dataclasses.replace(dev, config=dev.config.model_copy(update={"embed": embed}))
        rows: dict[str, dict[str, float]] = {}
        notes: dict[str, str] = {}
        variants = RAGPIPE_VARIANTS + [parse_variant(v) for v in args.variant]
        with Retriever(dev.config) as retriever:
            runs = {} if args.no_peers else peers(dev, retriever.store)
            runs.update(ragpipe_runs(dev, variants, retriever))
            if not args.no_tune:
                variant, notes["ragpipe tuned (eval tune)"] = tuned(dev, retriever)
                runs.update(ragpipe_runs(dev, [variant], retriever))
                notes["settings"] = json.dumps(variant.overrides, sort_keys=True)
        for label, sets in others.items():
            other = sets[dev.name]
            with Retriever(other.config) as retriever:
                runs[label] = ragpipe_runs(other, [Variant(label)], retriever)[label]
        for name, run in runs.items():
            rows[name] = score(run, dev.qrels)
        results[dev.name] = {"rows": rows, "notes": notes, "granularity": dev.granularity.value}
        print(
            f"\n{dev.name} ({len(dev.golden.items)} queries, {dev.granularity.value} granularity)"
        )
        print(f"  {'':40s} {'NDCG@10':>8s} {'MRR':>8s} {'R@10':>8s}")
        for name, m in rows.items():
            print(f"  {name:40s} {m['ndcg@10']:8.4f} {m['mrr']:8.4f} {m['recall@10']:8.4f}")
        for name, note in notes.items():
            print(f"  {name}: {note}")
        default = rows["ragpipe default"]["ndcg@10"]
        dense = rows["ragpipe dense leg"]["ndcg@10"]
        checks = [f"default {default:.4f} >= its dense leg {dense:.4f}: {default >= dense}"]
        raw = f"raw {_short(args.embedder)} cosine"
        if raw in rows:
            peer = rows[raw]["ndcg@10"]
            checks.append(f"default / {raw} = {default / peer:.3f}")
        target = 0.76 if dev.name == "debfaq" else 0.96
        checks.append(f"default >= {target}: {default >= target}")
        print("  " + "; ".join(checks), flush=True)
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

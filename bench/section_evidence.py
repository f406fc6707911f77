"""Whole-section evidence against today's first-chunk lead, on both dev sets, in one run.

A heading section longer than ``chunk.size`` is cut into chunks even when the
embedder could read it whole; the dense leg then sees it only piece by piece,
and the document signal only through the document's first chunk (its lead).
Three ways to give the embedder the whole section, each measured against the
shipped default on the same queries (NDCG@10, MRR, Recall@10 by pytrec_eval):

- ``chunk.whole_sections: true`` (built): a section that fits the window is one
  chunk. A separate index per set, built under ``--work``/chunk-whole_sections=True.
- section as the document signal (not built; measured here): each chunk's lead
  cosine is replaced by its whole section's cosine, where the section fits the
  window (else the lead is kept).
- section as an extra vector per chunk (not built; measured here): a chunk's own
  cosine is the larger of its own and its whole section's.

Then ``eval tune --ingest-options`` decides ``chunk.whole_sections`` on each set as
a user's run would (seed 0: the coordinate search on each index over the tuning
half, the held-out half confirming); its verdict and held-out delta are printed
and stored. Tune builds its own copy of the whole-sections index, beside the
set's work dir (``work.tune/``).

The two unbuilt designs need a second stored vector per chunk (a schema change
in both stores). They are measured here before building them: the section
texts are rebuilt from the stored chunks (their character spans), embedded by
the index's own embedder with the same heading prefix as the chunks, and
applied by a Retriever subclass that changes only the document-signal step.

Usage: python bench/section_evidence.py [--work DIR] [--embedder all-mpnet-base-v2]
       [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import retrieval_quality as rq

from ragpipe.evaluation.retrieval import Variant
from ragpipe.evaluation.sibling import INGEST_SPACE, build_siblings
from ragpipe.evaluation.tune import delta_ci, run_tune
from ragpipe.ingest.chunk import TokenCounter, whole_section_fits
from ragpipe.models.embedders import contextual_text, make_embedder
from ragpipe.query.results import Retrieved, ranked
from ragpipe.query.retrieve import Retriever
from ragpipe.store import VectorStore

Vector = npt.NDArray[np.float32]


class SectionRetriever(Retriever):
    """The default retriever with the section vectors applied after the document signal
    (``use``: ``lead`` leaves it as shipped; ``signal``: the section's cosine instead of
    the lead's; ``extra``: the chunk's own cosine is max(own, section))."""

    use: ClassVar[str] = "lead"
    sections: ClassVar[dict[str, Vector]] = {}

    def _with_document(
        self, vector: Vector, hits: list[Retrieved], weight: float
    ) -> list[Retrieved]:
        out = super()._with_document(vector, hits, weight)
        if self.use == "lead":
            return out
        for hit in out:
            section = self.sections.get(hit.point_id)
            if section is None:
                continue
            cosine = float(section @ vector)
            own, lead = hit.scores["chunk_cosine"], hit.scores["doc"]
            if self.use == "signal":
                hit.score = (1 - weight) * own + weight * cosine
            else:
                hit.score = (1 - weight) * max(own, cosine) + weight * lead
            hit.scores["dense"] = hit.score
        return ranked(out)


def section_vectors(dev: rq.DevSet, store: VectorStore) -> tuple[dict[str, Vector], dict[str, int]]:
    """Each chunk's whole-section vector, for sections of several chunks that
    ``chunk.whole_sections`` would keep whole; and counts of sections, sections of several
    chunks, and those."""
    # A section: a run of a document's consecutive chunks under one heading path.
    points = sorted(
        store.scroll(), key=lambda h: (str(h.payload["doc_id"]), int(h.payload["chunk_index"]))
    )
    groups: list[tuple[tuple[str, ...], list[tuple[int, int, str, str]]]] = []
    previous: tuple[str, tuple[str, ...]] | None = None
    for hit in points:
        p = hit.payload
        key = (str(p["doc_id"]), tuple(p["heading_path"]))
        if key != previous:
            groups.append((key[1], []))
            previous = key
        groups[-1][1].append(
            (int(p["char_start"]), int(p["char_end"]), str(p["text"]), hit.point_id)
        )
    counter = TokenCounter(dev.config.chunk.tokenizer)
    texts, owners = [], []
    several = 0
    for headings, chunks in groups:
        if len(chunks) < 2:
            continue  # its only chunk is the whole section already
        several += 1
        chars: dict[int, str] = {}
        for start, end, text, _ in sorted(chunks):
            part = text[-(end - start) :]  # a table part's body follows its repeated header
            chars.update((start + i, c) for i, c in enumerate(part))
        section = "".join(chars.get(i, "\n") for i in range(min(chars), max(chars) + 1))
        body = section.strip()
        if whole_section_fits(body, headings, dev.config.chunk, counter):
            whole = contextual_text(list(headings), body)
            texts.append(whole)
            owners.append([c[3] for c in chunks])
    embedder = make_embedder(dev.config.embed)
    vectors = embedder.embed_documents(texts) if texts else np.zeros((0, 1), np.float32)
    found = {
        pid: np.asarray(v, np.float32)
        for ids, v in zip(owners, vectors, strict=True)
        for pid in ids
    }
    counts = {"sections": len(groups), "several_chunks": several, "several_and_fit": len(texts)}
    return found, counts


def tune(dev: rq.DevSet) -> dict[str, Any]:
    """What ``eval tune --ingest-options`` decides on ``dev`` (seed 0)."""
    siblings = build_siblings(dev.config, INGEST_SPACE)
    outcome = run_tune(
        dev.config, dev.golden, granularity=dev.granularity, seed=0, siblings=siblings
    )
    ci = outcome.delta.interval
    return {
        "decision": outcome.decision,
        "changes": outcome.changes,
        "chunk.whole_sections": outcome.options["chunk.whole_sections"],
        "held_out": f"{outcome.metric} {ci.mean:+.4f} ({delta_ci(ci)})",
        "trials": len(outcome.trials),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=rq.REPO / "bench" / ".cache" / "quality")
    parser.add_argument("--embedder", default=None, help="a packaged embedder (all-mpnet-base-v2)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    name = args.embedder or "all-MiniLM-L6-v2"
    out = args.json or rq.REPO / "bench" / "results" / f"section_evidence_{name}.json"
    started = time.perf_counter()
    results: dict[str, Any] = {"embedder": name}
    whole = {d.name: d for d in rq.build(args.work, args.embedder, {"whole_sections": True})}
    for dev in rq.build(args.work, args.embedder):
        rows: dict[str, dict[str, float]] = {}
        with SectionRetriever(dev.config) as retriever:
            SectionRetriever.sections, counts = section_vectors(dev, retriever.store)
            counts["chunks"] = retriever.store.count()
            for use, label in (
                ("lead", "first-chunk lead (default)"),
                ("signal", "section as the document signal"),
                ("extra", "section as an extra vector"),
            ):
                SectionRetriever.use = use
                run = rq.ragpipe_runs(dev, [Variant("x")], retriever)["x"]
                rows[label] = rq.score(run, dev.qrels)
            SectionRetriever.use = "lead"
            rows["dense leg"] = rq.score(
                rq.ragpipe_runs(dev, [Variant("x", {"mode": "dense"})], retriever)["x"], dev.qrels
            )
        other = whole[dev.name]
        with Retriever(other.config) as retriever:
            rows["chunk.whole_sections: true"] = rq.score(
                rq.ragpipe_runs(other, [Variant("x")], retriever)["x"], other.qrels
            )
            rows["chunk.whole_sections: true, dense leg"] = rq.score(
                rq.ragpipe_runs(other, [Variant("x", {"mode": "dense"})], retriever)["x"],
                other.qrels,
            )
            counts["chunks_whole_sections"] = retriever.store.count()
        results[dev.name] = {"rows": rows, "counts": counts, "tune": tune(dev)}
        print(f"\n{dev.name} ({name}; {len(dev.golden.items)} queries): {counts}")
        print(f"  {'':40s} {'NDCG@10':>8s} {'MRR':>8s} {'R@10':>8s}")
        base = rows["first-chunk lead (default)"]["ndcg@10"]
        for label, m in rows.items():
            print(
                f"  {label:40s} {m['ndcg@10']:8.4f} {m['mrr']:8.4f} {m['recall@10']:8.4f}"
                f"   {m['ndcg@10'] - base:+.4f}"
            )
        print(f"  eval tune --ingest-options: {results[dev.name]['tune']}")
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

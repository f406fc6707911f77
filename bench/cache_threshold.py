"""The semantic cache's threshold, measured on both dev golden sets (issue 20).

``ragpipe serve`` answers a new question from its cache when the cosine between
the two questions' embeddings is at least ``serve.cache_threshold``. Too low and
a different question gets someone else's answer; too high and a rephrasing pays
for retrieval and generation again. Measured here with the default embedder:

- **wrong hits**: every pair of different questions in a dev set (different
  relevant documents or chunks; two questions with the same targets ask the
  same thing). The highest cosine among them is where a cache starts serving
  wrong answers. Both sets: debfaq (116 real questions, semantic) and the
  R-FAQ dev set (lexical, many "How can I ... in R?" questions).
- **wanted hits**: each question against rewrites that keep its meaning (no
  final punctuation, a polite prefix or suffix, a framing prefix).

For each candidate threshold: wrong-hit pairs on each set and the share of
rewrites served. The default is the lowest candidate with no wrong hit on
either set and a margin of at least ``MARGIN`` above the highest different
pair of both (held-out questions will have closer pairs than these).

Usage: python bench/cache_threshold.py [--json bench/results/cache_threshold.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus"
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.evaluation.golden import GoldenSet, import_beir, load_golden  # noqa: E402
from ragpipe.models.embedders import embedder_name, make_embedder  # noqa: E402
from ragpipe.serve.cache import meaning_conflict, unit  # noqa: E402

CANDIDATES = [0.85, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99]
MARGIN = 0.03

# Hand-written minimal pairs: one word apart, different answers (a probe, not a dev set).
MINIMAL_PAIRS = [
    ("How do I install R on Windows?", "How do I install R on a Mac?"),
    ("How can add-on packages be installed?", "How can add-on packages be removed?"),
    ("How do I upgrade Debian?", "How do I downgrade Debian?"),
    ("Can I run R on Linux?", "Can I run R on Windows?"),
    ("How do I enable the firewall?", "How do I disable the firewall?"),
    ("How should I cite R?", "How should I cite R packages?"),
    ("Why does R crash on startup?", "Why does R crash on exit?"),
    ("How do I restore the database?", "How do I back up the database?"),
]

# Long questions one word, number or negation apart (issue 31): a changed word moves a long
# question's embedding little, so these score above any threshold worth having; the cache's
# meaning guard (serve.cache.meaning_conflict) must refuse every one.
LONG_MINIMAL_PAIRS = [
    ("Is it safe to grant the admin role to every user of the shared database server?",
     "Is it unsafe to grant the admin role to every user of the shared database server?"),
    ("Does the backup tool in release 7.2 keep incremental copies for fourteen days?",
     "Does the backup tool in release 7.1 keep incremental copies for fourteen days?"),
    ("Is R free software that anyone may copy, change and share under the GPL?",
     "Is R not free software that anyone may copy, change and share under the GPL?"),
    ("How do I enable the firewall on a Debian server that runs the mail service?",
     "How do I disable the firewall on a Debian server that runs the mail service?"),
    ("Should I upgrade the packages on the production cluster during business hours?",
     "Should I downgrade the packages on the production cluster during business hours?"),
    ("Can I install R packages into my home directory without administrator rights?",
     "Can't I install R packages into my home directory without administrator rights?"),
    ("What does the error \"disk quota exceeded\" mean when R saves the workspace?",
     "What does the error \"file not found\" mean when R saves the workspace?"),
    ("How many CPU cores does the default build of R use for matrix products on Linux?",
     "How many CPU cores does the default build of R never use for matrix products on Linux?"),
    ("How do I import the customer table from the old PostgreSQL 9.6 server?",
     "How do I export the customer table from the old PostgreSQL 9.6 server?"),
    ("Is the cache invalidated when a document in the index is updated overnight?",
     "Is the cache not invalidated when a document in the index is updated overnight?"),
    # The same words in another order (a review's attack: each a cache hit at 0.97-0.998).
    ("How do I copy the database backup from server A to server B?",
     "How do I copy the database backup from server B to server A?"),
    ("How do I migrate my scripts from Python 2 to Python 3?",
     "How do I migrate my scripts from Python 3 to Python 2?"),
    ("How do I convert a data frame to a matrix in R?",
     "How do I convert a matrix to a data frame in R?"),
    ("Can the admin delete a user's files on the shared server?",
     "Can a user delete the admin's files on the shared server?"),
]  # fmt: skip

REWRITES = {
    "no final punctuation": lambda q: q.rstrip("?.! "),
    "polite prefix": lambda q: "Please tell me: " + q,
    "thanks suffix": lambda q: q + " Thanks!",
    "framing prefix": lambda q: "I have a question. " + q,
}


def targets(golden: GoldenSet) -> dict[str, frozenset[str]]:
    """What answers each question: its relevant files and chunk targets."""
    return {
        item.id: frozenset(item.relevance) | frozenset(t.key for t in item.chunks)
        for item in golden.items
    }


def measure(name: str, golden: GoldenSet, embed: Any) -> dict[str, Any]:
    items = golden.items
    vectors = np.stack([unit(embed(i.query)) for i in items])
    answers = targets(golden)
    different = []
    for a, b in itertools.combinations(range(len(items)), 2):
        if answers[items[a].id] != answers[items[b].id]:
            different.append((float(vectors[a] @ vectors[b]), a, b))
    different.sort(reverse=True)
    rewrites: dict[str, list[float]] = {}
    for kind, rewrite in REWRITES.items():
        variants = np.stack([unit(embed(rewrite(i.query))) for i in items])
        rewrites[kind] = [float(x) for x in np.sum(vectors * variants, axis=1)]
    every_rewrite = [s for scores in rewrites.values() for s in scores]
    # The meaning guard must keep every meaning-keeping rewrite servable.
    guarded = sum(
        1
        for rewrite in REWRITES.values()
        for i in items
        if meaning_conflict(i.query, rewrite(i.query)) is not None
    )
    per_threshold = {
        f"{t:.2f}": {
            "wrong_pairs": sum(1 for s, _, _ in different if s >= t),
            "rewrites_served": sum(1 for s in every_rewrite if s >= t) / len(every_rewrite),
        }
        for t in CANDIDATES
    }
    top = [
        {"cosine": round(s, 4), "a": items[a].query, "b": items[b].query}
        for s, a, b in different[:5]
    ]
    return {
        "set": name,
        "questions": len(items),
        "different_pairs": len(different),
        "max_different": round(different[0][0], 4),
        "p999_different": round(float(np.quantile([s for s, _, _ in different], 0.999)), 4),
        "closest_different": top,
        "rewrites": {
            kind: {"min": round(min(v), 4), "median": round(float(np.median(v)), 4)}
            for kind, v in rewrites.items()
        },
        "per_threshold": per_threshold,
        "rewrites_refused_by_guard": guarded,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/cache_threshold.json")
    args = parser.parse_args()
    config = RagpipeConfig()
    embedder = make_embedder(config.embed)
    with tempfile.TemporaryDirectory() as tmp:
        debfaq = import_beir(SHARED / "debfaq", Path(tmp) / "corpus")
    rfaq = load_golden(REPO / "eval" / "golden" / "r-faq-dev.yaml")
    results = [
        measure("debfaq", debfaq, embedder.embed_query),
        measure("r-faq", rfaq, embedder.embed_query),
    ]
    print(f"embedder: {embedder_name(config.embed)}")
    for r in results:
        print(
            f"\n{r['set']}: {r['questions']} questions, {r['different_pairs']} pairs of "
            f"different questions; highest cosine {r['max_different']:.4f} "
            f"(99.9th percentile {r['p999_different']:.4f})"
        )
        for pair in r["closest_different"][:3]:
            print(f"  {pair['cosine']:.4f}  {pair['a']!r}  vs  {pair['b']!r}")
        for kind, stats in r["rewrites"].items():
            print(f"  rewrite {kind:22s} min {stats['min']:.4f}  median {stats['median']:.4f}")
    print("\nthreshold  " + "  ".join(f"{r['set']:>8s} wrong  served" for r in results))
    for t in CANDIDATES:
        row = [r["per_threshold"][f"{t:.2f}"] for r in results]
        cells = "  ".join(f"{c['wrong_pairs']:14d}  {c['rewrites_served']:6.1%}" for c in row)
        print(f"{t:9.2f}  {cells}")
    minimal = sorted(
        ((float(unit(embedder.embed_query(a)) @ unit(embedder.embed_query(b))), a, b)
         for a, b in MINIMAL_PAIRS),
        reverse=True,
    )  # fmt: skip
    long_pairs = [
        (float(unit(embedder.embed_query(a)) @ unit(embedder.embed_query(b))),
         meaning_conflict(a, b), a, b)
        for a, b in LONG_MINIMAL_PAIRS
    ]  # fmt: skip
    over = [p for p in long_pairs if p[0] >= config.serve.cache_threshold]
    wrong = [p for p in long_pairs if p[0] >= config.serve.cache_threshold and p[1] is None]
    print(
        f"\nlong minimal pairs: {len(over)} of {len(long_pairs)} at or above the threshold "
        f"{config.serve.cache_threshold} by cosine alone; wrong hits with the meaning guard: "
        f"{len(wrong)} (target 0)"
    )
    for cosine, why, a, _ in sorted(long_pairs, reverse=True)[:4]:
        print(f"  {cosine:.4f}  refused ({why})  {a[:60]!r}…" if why else f"  {cosine:.4f}  {a!r}")
    for r in results:
        print(f"  {r['set']}: rewrites the guard refuses: {r['rewrites_refused_by_guard']}")
    print(f"\nminimal pairs (hand-written, different answers): highest {minimal[0][0]:.4f}")
    for cosine, a, b in minimal[:3]:
        print(f"  {cosine:.4f}  {a!r}  vs  {b!r}")
    highest = max(r["max_different"] for r in results)
    safe = [t for t in CANDIDATES if t >= highest + MARGIN]
    chosen = safe[0] if safe else None
    served = (
        [r["per_threshold"][f"{chosen:.2f}"]["rewrites_served"] for r in results] if chosen else []
    )
    print(
        f"\nhighest different-question cosine over both sets: {highest:.4f}; with a margin of "
        f"{MARGIN}: threshold {chosen} (rewrites served: "
        + ", ".join(f"{r['set']} {s:.1%}" for r, s in zip(results, served, strict=True))
        + f"); configured default: {config.serve.cache_threshold}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"embedder": embedder_name(config.embed), "margin": MARGIN, "chosen": chosen,
             "default": config.serve.cache_threshold, "sets": results,
             "minimal_pairs": [{"cosine": round(c, 4), "a": a, "b": b} for c, a, b in minimal],
             "long_minimal_pairs": [{"cosine": round(c, 4), "guard": w, "a": a, "b": b}
                                    for c, w, a, b in long_pairs]},
            indent=2,
        ) + "\n",
        encoding="utf-8",
    )  # fmt: skip


if __name__ == "__main__":
    main()

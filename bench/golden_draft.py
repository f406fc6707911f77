"""`ragpipe golden draft` on the shipped sample corpus: what the drafts are worth (issue 35).

Indexes ``data/sample`` (the default embedder; reused under ``--work``), drafts a golden
set from it with the configured (packaged) model, ``--sample`` model questions, then:

1. **Question headings against the hand-written set**: how many of the drafted heading
   items ask the same question with the same target as ``eval/golden/r-faq-dev.yaml``
   (the R FAQ's numbered questions, written by scripts/make_golden_rfaq.py).
2. **Model questions against a person's review**: ``bench/results/golden_draft_review.json``
   holds a reviewer's verdict on each model question of this run's configuration (keep,
   or drop and why); the share kept is printed. Questions the review has not seen are
   listed as unreviewed (the verdicts are a person's, not computed).
3. **Retrieval on the drafts vs the hand-written set**: ``eval retrieval`` (chunk
   granularity, the defaults) on the heading items, on the kept model questions, and on
   the hand-written set, NDCG@10 and MRR with 95% CIs.

Results: bench/results/golden_draft.json.

Usage: python bench/golden_draft.py [--work DIR] [--sample 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import yaml  # noqa: E402

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.evaluation.draft import draft_golden  # noqa: E402
from ragpipe.evaluation.golden import load_golden  # noqa: E402
from ragpipe.evaluation.run import run_retrieval  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.models.embedders import embedder_name  # noqa: E402
from ragpipe.models.llm import make_llm  # noqa: E402
from ragpipe.store import open_reader  # noqa: E402

REVIEW = REPO / "bench" / "results" / "golden_draft_review.json"


def _scores(cfg: RagpipeConfig, golden: Path) -> dict[str, Any]:
    set_cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"golden": golden})})
    summary = run_retrieval(set_cfg)[1].as_json()
    metrics = summary["metrics"]["default"]
    return {m: {k: metrics[m][k] for k in ("mean", "ci_low", "ci_high", "n")}
            for m in ("ndcg@10", "mrr")}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench" / ".cache" / "golden_draft")
    parser.add_argument("--sample", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" /
                        "golden_draft.json")  # fmt: skip
    args = parser.parse_args()
    work = args.work.resolve()
    cfg = RagpipeConfig.model_validate({
        "discover": {"roots": [str(REPO / "data" / "sample")]},
        "store": {"path": str(work / "store")},
        "paths": {"work_dir": str(work / "work")},
        "eval": {"reports_dir": str(work / "reports")},
    })  # fmt: skip
    print(run_ingest(cfg).line(), flush=True)
    store = open_reader(cfg.store, embedder_name(cfg.embed))
    assert store is not None
    llm = make_llm(cfg.llm)
    started = time.perf_counter()
    try:
        golden, drafted = draft_golden(store, llm, args.sample, args.seed, "draft")
    finally:
        store.close()
    seconds = time.perf_counter() - started
    items = golden["items"]
    headings = [i for i in items if i["provenance"]["method"] == "heading"]
    model = [i for i in items if i["provenance"]["method"] == "llm"]
    dev = load_golden(REPO / "eval" / "golden" / "r-faq-dev.yaml")
    dev_keys = {(i.query, i.chunks[0].heading) for i in dev.items if i.chunks}
    same = sum((i["query"], i["chunks"][0]["heading"]) in dev_keys for i in headings)
    review = json.loads(REVIEW.read_text(encoding="utf-8")) if REVIEW.is_file() else {}
    verdicts = review.get("verdicts", {})
    kept = [i for i in model if verdicts.get(i["query"], {}).get("keep") is True]
    unreviewed = [i["query"] for i in model if i["query"] not in verdicts]
    # The reviewed sets, as a person would leave them: no draft lines.
    sets: dict[str, Path] = {}
    for name, chosen in (("headings", headings), ("model-kept", kept)):
        if not chosen:
            continue
        path = work / f"{name}.yaml"
        clean = [{k: v for k, v in i.items() if k not in ("draft", "provenance")}
                 for i in chosen]  # fmt: skip
        path.write_text(yaml.safe_dump({"name": f"draft-{name}", "items": clean},
                                       sort_keys=False), encoding="utf-8")  # fmt: skip
        sets[name] = path
    sets["hand-written"] = REPO / "eval" / "golden" / "r-faq-dev.yaml"
    scores = {name: _scores(cfg, path) for name, path in sets.items()}
    result = {
        "model": llm.name,
        "sample": args.sample,
        "seed": args.seed,
        "draft_seconds": round(seconds, 1),
        "heading_items": len(headings),
        "heading_items_same_as_hand_written": same,
        "hand_written_items": len(dev.items),
        "model_questions_asked": drafted.asked,
        "model_questions_kept_by_filters": len(model),
        "dropped_by_filters": drafted.dropped,
        "model_questions_kept_by_reviewer": len(kept),
        "unreviewed": unreviewed,
        "retrieval": scores,
        "model_questions": [
            {"query": i["query"], "target": i["chunks"][0], "review": verdicts.get(i["query"])}
            for i in model
        ],
    }
    print(f"draft: {seconds:.0f} s with {llm.name}")
    print(f"question headings: {len(headings)}, the same question and target as the "
          f"hand-written set: {same} of {len(dev.items)}")  # fmt: skip
    print(f"model questions: {drafted.asked} asked, {len(model)} kept by the filters "
          f"({drafted.dropped}), {len(kept)} kept by the reviewer"
          + (f"; {len(unreviewed)} not reviewed" if unreviewed else ""))  # fmt: skip
    for name, s in scores.items():
        n, m = s["ndcg@10"], s["mrr"]
        ci = (f"[{n['ci_low']:.3f}, {n['ci_high']:.3f}]" if n["ci_low"] is not None
              else "(no CI)")  # fmt: skip
        print(f"  {name:13s} n={n['n']:3d}  NDCG@10 {n['mean']:.3f} {ci}  MRR {m['mean']:.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

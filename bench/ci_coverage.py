"""How often a "95%" CI of a mean holds the true mean, by n (the eval's CI rule).

Draws ``--runs`` samples of n scores from three distributions whose mean is known (uniform
on [0, 1]; 0/1 with P(1) = 0.7, as hit@3 or success@5; an NDCG-like mix, 1 with P 0.75
else uniform on [0, 0.6], mean 0.825) and counts the runs whose interval holds the mean,
for the plain percentile bootstrap (ragpipe's until 2026-12-04) and the expanded one
``metrics.bootstrap_ci`` computes (Hesterberg 2015). The eval gives no CI below
``metrics.MIN_CI_N``: this is the measurement behind that bound.

Usage: python bench/ci_coverage.py [--runs 2000] [--resamples 500]
       [--json bench/results/ci_coverage.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ragpipe.evaluation.metrics import MIN_CI_N, expanded_alpha

SIZES = (3, 5, 8, 10, 15, 20, 30)


def _draws(rng: np.random.Generator) -> dict[str, tuple[Callable[[int], np.ndarray], float]]:
    def ndcg_like(n: int) -> np.ndarray:
        return np.where(rng.uniform(size=n) < 0.75, 1.0, rng.uniform(size=n) * 0.6)

    return {
        "uniform": (lambda n: rng.uniform(size=n), 0.5),
        "zero-one 0.7": (lambda n: (rng.uniform(size=n) < 0.7).astype(float), 0.7),
        "ndcg-like": (ndcg_like, 0.75 + 0.25 * 0.3),
    }


def coverage(runs: int, resamples: int, seed: int = 1) -> dict[str, dict[str, dict[int, float]]]:
    """{distribution: {"percentile"|"expanded": {n: share of runs holding the mean}}}."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name, (draw, mean) in _draws(rng).items():
        held: dict[str, dict[int, float]] = {"percentile": {}, "expanded": {}}
        for n in SIZES:
            tails = {"percentile": 0.025, "expanded": expanded_alpha(0.95, n)}
            hits = dict.fromkeys(tails, 0)
            for _ in range(runs):
                x = draw(n)
                means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
                for way, a in tails.items():
                    low, high = np.quantile(means, [a, 1 - a])
                    hits[way] += low - 1e-12 <= mean <= high + 1e-12
            for way in tails:
                held[way][n] = hits[way] / runs
        out[name] = held
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=500)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = coverage(args.runs, args.resamples)
    print(f"share of {args.runs} runs whose 95% CI holds the mean (no CI below n={MIN_CI_N})")
    print(f"{'distribution':14s} {'interval':10s} " + " ".join(f"n={n:<5d}" for n in SIZES))
    for name, held in result.items():
        for way, by_n in held.items():
            print(f"{name:14s} {way:10s} " + " ".join(f"{by_n[n]:<7.3f}" for n in SIZES))
    if args.json:
        stored = {"runs": args.runs, "resamples": args.resamples, "coverage": result}
        args.json.write_text(json.dumps(stored, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

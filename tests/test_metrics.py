"""Our per-query metrics against trec_eval (pytrec_eval) on the same runs, to 1e-9;
bootstrap and paired-comparison statistics on known data."""

from __future__ import annotations

import random

import numpy as np
import pytest
import pytrec_eval

from ragpipe.evaluation.metrics import METRICS, bootstrap_ci, paired_delta, query_metrics

TREC = {
    "recall@5": "recall_5",
    "recall@10": "recall_10",
    "precision@5": "P_5",
    "mrr": "recip_rank",
    "success@5": "success_5",
    "hit@3": "success_3",
    "map": "map",
    "ndcg@10": "ndcg_cut_10",
}


def _random_cases(n: int, seed: int) -> list[tuple[list[str], dict[str, int]]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        docs = [f"d{i}" for i in range(30)]
        qrels = {d: rng.choice([0, 1, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 8))}
        if not any(g > 0 for g in qrels.values()):
            qrels[docs[0]] = 2
        ranked = rng.sample(docs, rng.randint(0, 15))  # sometimes empty, sometimes short
        cases.append((ranked, qrels))
    return cases


def _trec(cases: list[tuple[list[str], dict[str, int]]], exp: bool) -> dict[str, dict[str, float]]:
    qrels = {
        f"q{i}": {d: (2**g - 1 if exp else g) for d, g in rel.items()}
        for i, (_, rel) in enumerate(cases)
    }
    run = {
        f"q{i}": {d: float(len(ranked) - r) for r, d in enumerate(ranked)}
        for i, (ranked, _) in enumerate(cases)
    }
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, set(TREC.values()))
    return evaluator.evaluate({q: docs for q, docs in run.items() if docs})


def test_every_metric_matches_trec_eval() -> None:
    cases = _random_cases(300, seed=7)
    linear, exponential = _trec(cases, exp=False), _trec(cases, exp=True)
    for i, (ranked, qrels) in enumerate(cases):
        ours = query_metrics(ranked, qrels)
        assert set(ours) == set(METRICS)
        q = f"q{i}"
        if q not in linear:  # trec_eval drops a query that retrieved nothing: we score 0
            assert not ranked and all(v == 0.0 for v in ours.values())
            continue
        for name, trec_name in TREC.items():
            assert ours[name] == pytest.approx(linear[q][trec_name], abs=1e-9), (i, name)
        # BEIR-style exponential gain: trec_eval's ndcg with grades mapped to 2^g - 1.
        assert ours["ndcg@10_exp"] == pytest.approx(exponential[q]["ndcg_cut_10"], abs=1e-9)
    assert sum(1 for ranked, _ in cases if not ranked) > 0  # the empty case was exercised


def test_hand_computed_example() -> None:
    m = query_metrics(["x", "a", "y", "b"], {"a": 3, "b": 1, "c": 2, "z": 0})
    assert m["mrr"] == 0.5 and m["hit@3"] == 1.0 and m["precision@5"] == pytest.approx(2 / 5)
    assert m["recall@5"] == pytest.approx(2 / 3)
    assert m["map"] == pytest.approx((1 / 2 + 2 / 4) / 3)
    dcg = 3 / np.log2(3) + 1 / np.log2(5)
    idcg = 3 + 2 / np.log2(3) + 1 / np.log2(4)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)


def test_bootstrap_is_seeded_and_covers_the_mean() -> None:
    values = np.random.default_rng(3).random(200)
    a = bootstrap_ci(values, resamples=1000, seed=11)
    b = bootstrap_ci(values, resamples=1000, seed=11)
    assert a == b and a.low < a.mean < a.high and a.n == 200 and a.resamples == 1000
    assert a.mean == pytest.approx(values.mean())
    # The percentile interval of the mean is close to mean ± 1.96 standard errors.
    se = values.std(ddof=1) / np.sqrt(values.size)
    assert a.high - a.low == pytest.approx(2 * 1.96 * se, rel=0.15)
    constant = bootstrap_ci([0.5] * 10)
    assert (constant.low, constant.mean, constant.high) == (0.5, 0.5, 0.5)
    # Equal values resample to one mean: a zero-width CI, which reports show as none.
    assert constant.zero_width and not a.zero_width
    shown = constant.as_dict()
    assert shown["mean"] == 0.5 and shown["ci_low"] is None and shown["ci_high"] is None


def test_paired_delta_detects_a_real_difference_and_not_a_null_one() -> None:
    rng = np.random.default_rng(5)
    base = rng.random(100)
    better = base + 0.1 + rng.normal(0, 0.05, 100)
    shifted = paired_delta(base, better, seed=1)
    assert shifted.interval.low > 0.05 and shifted.p_value < 0.001
    same = paired_delta(base, base + rng.normal(0, 0.05, 100), seed=1)
    assert same.interval.low < 0 < same.interval.high and same.p_value > 0.05
    identical = paired_delta(base, base)
    assert identical.interval.mean == 0 and identical.p_value == 1.0
    assert identical.as_dict()["ci_low"] is None  # every delta 0: no CI, not [0, 0]
    # Every delta 0.2, as float subtraction writes them (0.19999999999999996, ...): no
    # CI either; it was "+0.200 [+0.200, +0.200]".
    alike = paired_delta([0.2, 0.4, 0.6, 0.0] * 3, [0.4, 0.6, 0.8, 0.2] * 3)
    assert alike.interval.zero_width and alike.as_dict()["ci_low"] is None
    # The gate still reads the bounds: a drop on every query is a drop.
    dropped = paired_delta([1.0] * 10, [0.5] * 10)
    assert (dropped.interval.low, dropped.interval.high) == (-0.5, -0.5)
    with pytest.raises(ValueError, match="same queries"):
        paired_delta(base, base[:10])


def test_no_ci_from_fewer_than_ten_values() -> None:
    one = bootstrap_ci([0.883], resamples=100, seed=0)
    assert one.mean == 0.883 and one.n == 1 and not one.has_ci
    assert one.as_dict()["ci_low"] is None and one.as_dict()["ci_high"] is None
    none = bootstrap_ci([], resamples=100, seed=0)
    assert none.as_dict()["mean"] is None and none.n == 0
    # The review: two values' "95% CI" held the mean in about half of simulated runs, and a
    # compare gate failed on two chance deltas; nine are still too few.
    nine = bootstrap_ci([0.0, 1.0] * 4 + [1.0], resamples=100, seed=0)
    assert nine.mean == pytest.approx(5 / 9) and not nine.has_ci and nine.n == 9
    assert nine.as_dict()["ci_low"] is None
    ten = bootstrap_ci([0.0, 1.0] * 5, resamples=100, seed=0)
    assert ten.has_ci and ten.low <= 0.5 <= ten.high
    delta = paired_delta([1.0], [0.0], resamples=100)
    assert not delta.interval.has_ci and delta.as_dict()["p_value"] is None
    few = paired_delta([0.0, 0.0, 0.0], [1.0, 1.0, 0.5], resamples=100)  # a p, no CI
    assert few.as_dict()["ci_low"] is None and few.p_value == pytest.approx(0.25, abs=0.02)


def test_the_expanded_interval_by_hand() -> None:
    """Hesterberg (2015): tails at Phi(-sqrt(n/(n-1)) t(0.975, n-1)). By hand with scipy's
    t: n=10, sqrt(10/9) * 2.262157 = 2.384543, Phi(-2.384543) = 0.008550; n=50,
    sqrt(50/49) * 2.009575 = 2.029999, Phi(-2.029999) = 0.021180."""
    from ragpipe.evaluation.metrics import expanded_alpha

    assert expanded_alpha(0.95, 10) == pytest.approx(0.008550, abs=2e-6)
    assert expanded_alpha(0.95, 50) == pytest.approx(0.021180, abs=2e-6)
    assert expanded_alpha(0.95, 100_000) == pytest.approx(0.025, abs=1e-4)
    # The interval is the resampled means' quantiles at those tails.
    values = np.linspace(0.0, 1.0, 10)
    ci = bootstrap_ci(values, resamples=1000, seed=3)
    rng = np.random.default_rng(3)
    means = values[rng.integers(0, 10, size=(1000, 10))].mean(axis=1)
    low, high = np.quantile(means, [0.008550, 1 - 0.008550])
    assert (ci.low, ci.high) == (pytest.approx(low, abs=1e-3), pytest.approx(high, abs=1e-3))
    assert ci.high - ci.low > np.subtract(*np.quantile(means, [0.975, 0.025]))  # wider

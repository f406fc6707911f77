"""Judge agreement (accuracy, Cohen's kappa, bootstrap CIs), prediction-powered means and
human label files, against values computed by hand in the tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as T

from ragpipe.errors import ConfigError
from ragpipe.evaluation.agreement import (
    Label,
    agreement,
    chance_p,
    cohen_kappa,
    labels_by_metric,
    load_labels,
    ppi_mean,
)

T_975_2 = 4.302652729749464  # Student's t, 97.5th percentile, 2 degrees of freedom (tables)


# --------------------------------------------------------------------------- kappa


def test_cohen_kappa_worked_example() -> None:
    truth = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    verdicts = [1, 1, 1, 1, 0, 0, 1, 0, 0, 0]
    # Agree on pairs 0-3 (yes/yes) and 7-9 (no/no): 7 of 10.
    p_o = 7 / 10
    # truth says yes 6/10, the judge 5/10 (pairs 0-3 and 6).
    p_e = (6 / 10) * (5 / 10) + (4 / 10) * (5 / 10)  # 0.30 + 0.20 = 0.50
    expected = (p_o - p_e) / (1 - p_e)  # 0.20 / 0.50 = 0.4
    assert expected == pytest.approx(0.4)
    assert cohen_kappa(truth, verdicts) == pytest.approx(expected, abs=1e-12)


def test_always_yes_judge_on_balanced_probe_has_kappa_zero() -> None:
    truth = [1, 0] * 10
    verdicts = [1] * 20
    # p_o = 10/20 = 0.5; p_e = 0.5 * 1 + 0.5 * 0 = 0.5; kappa = 0 / 0.5 = 0.
    assert cohen_kappa(truth, verdicts) == 0.0
    result = agreement(truth, verdicts, resamples=200, seed=1)
    assert result.accuracy == 0.5
    assert result.kappa == 0.0
    assert result.yes_share == 1.0
    # Every resample has constant verdicts: kappa 0 (or undefined when truth is constant
    # too), a zero-width interval: shown as no CI, not as a certain 0.
    assert math.isnan(result.kappa_low) and math.isnan(result.kappa_high)


def test_perfect_judge_has_kappa_one() -> None:
    truth = [1, 0, 0, 1, 1, 0, 1, 0]
    assert cohen_kappa(truth, truth) == 1.0
    result = agreement(truth, truth, resamples=200)
    assert (result.accuracy, result.kappa, result.failed) == (1.0, 1.0, 0)
    # Every resample agrees fully (undefined kappas dropped): no CI rather than [1, 1].
    assert math.isnan(result.accuracy_low) and math.isnan(result.accuracy_high)
    assert math.isnan(result.kappa_low) and math.isnan(result.kappa_high)


def test_constant_equal_labels_give_nan_kappa() -> None:
    # p_o = 1, p_e = 1 * 1 + 0 * 0 = 1: kappa = 0/0, undefined.
    assert math.isnan(cohen_kappa([1, 1, 1], [1, 1, 1]))
    assert math.isnan(cohen_kappa([0, 0], [0, 0]))
    result = agreement([1, 1, 1, 1], [1, 1, 1, 1], resamples=50)
    assert result.accuracy == 1.0
    assert math.isnan(result.kappa)
    # Every resample is undefined too, so nothing is left for the percentile.
    assert math.isnan(result.kappa_low) and math.isnan(result.kappa_high)


def test_kappa_is_the_nearest_float_to_the_exact_fraction() -> None:
    """From shares, 7 of 10 balanced pairs right came out 0.3999999999999999, under a bar
    of 0.4 it is exactly at: p_o = 7/10, both yes rates 1/2, p_e = 1/2, kappa = 2/5."""
    truth = [1] * 5 + [0] * 5
    verdicts = [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]
    assert agreement(truth, verdicts).kappa == 0.4
    assert cohen_kappa(truth, verdicts) == 0.4
    # 28 of 40 right (6 true and 6 false pairs wrong): 2/5 again; 3 of 4 right, one true
    # pair called false: p_o = 3/4, yes rates 1/2 and 1/4, p_e = 1/2, kappa = 1/2.
    forty = [1, 0] * 20
    assert cohen_kappa(forty, [1 - t if i < 12 else t for i, t in enumerate(forty)]) == 0.4
    assert cohen_kappa([1, 1, 0, 0], [0, 1, 0, 0]) == 0.5


def test_cohen_kappa_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one verdict per truth label"):
        cohen_kappa([1, 0], [1])
    with pytest.raises(ValueError, match="at least one pair"):
        cohen_kappa([], [])
    with pytest.raises(ValueError, match="0/1"):
        cohen_kappa([1, 2], [1, 0])


def test_failed_verdicts_count_as_wrong() -> None:
    truth = [1, 0, 1, 0, 1, 0]
    verdicts: list[int | None] = [1, None, None, 0, 1, 1]
    result = agreement(truth, verdicts, resamples=100)
    assert result.n == 6
    assert result.failed == 2
    # As scored: [1, 1, 0, 0, 1, 1] (None -> 1 - truth). Right on pairs 0, 3, 4: 3/6.
    assert result.accuracy == pytest.approx(3 / 6)
    # p_o = 0.5; truth yes 3/6, scored yes 4/6: p_e = 0.5*4/6 + 0.5*2/6 = 0.5; kappa = 0.
    assert result.kappa == pytest.approx(0.0, abs=1e-12)
    # The judge itself said "yes" on pairs 0, 4, 5 (a failure is not a yes).
    assert result.yes_share == pytest.approx(3 / 6)
    # Dropping failures instead would have given 3 of 4 right: that is not what we report.
    assert result.accuracy != pytest.approx(3 / 4)


def test_agreement_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one verdict per probe pair"):
        agreement([1, 0], [1])
    with pytest.raises(ValueError, match="at least one pair is needed"):
        agreement([], [])
    with pytest.raises(ValueError, match="resamples"):
        agreement([1, 0], [1, 0], resamples=0)


def test_bootstrap_ci_is_seeded_and_contains_the_estimate() -> None:
    truth = [1, 0] * 20
    # Right on 32 of 40 pairs: wrong on 4 yes-pairs and 4 no-pairs.
    verdicts = [1 - t if i < 8 else t for i, t in enumerate(truth)]
    result = agreement(truth, verdicts, resamples=500, seed=7)
    assert result.accuracy == pytest.approx(32 / 40)
    # p_o = 0.8; both say yes half the time: p_e = 0.5; kappa = 0.3 / 0.5 = 0.6.
    assert result.kappa == pytest.approx(0.6)
    assert result.accuracy_low <= result.accuracy <= result.accuracy_high
    assert result.kappa_low <= result.kappa <= result.kappa_high
    assert result.accuracy_low < result.accuracy_high
    assert agreement(truth, verdicts, resamples=500, seed=7) == result
    other = agreement(truth, verdicts, resamples=500, seed=8)
    assert (other.kappa_low, other.kappa_high) != (result.kappa_low, result.kappa_high)
    assert set(result.as_dict()) == {
        "n", "failed", "accuracy", "accuracy_low", "accuracy_high",
        "kappa", "kappa_low", "kappa_high", "yes_share", "p_chance",
    }  # fmt: skip


def test_chance_p_is_the_best_a_judge_blind_to_the_truth_does() -> None:
    """By hand. Balanced pairs: a coin is the best blind judge, P(>= r right of n) =
    sum_{k >= r} C(n, k) / 2^n. Unbalanced (3 true, 1 false), all right: a blind judge saying
    yes with rate q gets all four with q^3 (1 - q), largest at q = 3/4: 27/256. A judge that
    always says yes gets the true half right, which any blind judge does half the time or
    more: chance 1. A failed verdict already counts as wrong (agreement does that)."""
    truth = [1, 1, 1, 1, 0, 0, 0, 0]
    assert chance_p(truth, truth) == pytest.approx(1 / 256)
    assert chance_p(truth, [1, 1, 1, 0, 0, 0, 0, 0]) == pytest.approx(9 / 256)
    assert chance_p(truth, [1, 1, 0, 1, 0, 0, 1, 0]) == pytest.approx(37 / 256)
    assert chance_p([1, 1, 0, 0], [1, 1, 0, 0]) == pytest.approx(1 / 16)
    assert chance_p([1, 1, 1, 0], [1, 1, 1, 0]) == pytest.approx(27 / 256)
    assert chance_p(truth, [1] * 8) == 1.0
    # Only the count of right verdicts matters, not which pairs.
    assert chance_p(truth, [0, 1, 1, 1, 0, 0, 0, 0]) == chance_p(truth, [1, 1, 1, 1, 1, 0, 0, 0])
    failed = agreement(truth, [None, 1, 1, 1, 0, 0, 0, 0])  # None: wrong, 7 right
    assert failed.failed == 1 and failed.p_chance == pytest.approx(9 / 256)
    # 40 pairs, 32 right: sum_{k >= 32} C(40, k) / 2^40.
    big = [1, 0] * 20
    verdicts = [1 - t if i < 8 else t for i, t in enumerate(big)]
    expected = sum(math.comb(40, k) for k in range(32, 41)) / 2**40
    assert chance_p(big, verdicts) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="one verdict per truth label"):
        chance_p([1, 0], [1])
    # The fewest balanced pairs a judge can be trusted on (calibration.TRUSTABLE_PAIRS):
    # all 6 right is 1/64 < 0.05; all 4 right is 1/16, over it.
    from ragpipe.evaluation.calibration import CHANCE_P, TRUSTABLE_PAIRS

    def all_right(n: int) -> float:
        return chance_p([1, 0] * (n // 2), [1, 0] * (n // 2))

    assert all_right(TRUSTABLE_PAIRS) == pytest.approx(1 / 64) and CHANCE_P > 1 / 64
    assert all_right(TRUSTABLE_PAIRS - 2) == pytest.approx(1 / 16) and CHANCE_P < 1 / 16


def test_single_pair_has_no_ci() -> None:
    result = agreement([1], [None])
    assert (result.n, result.failed, result.accuracy) == (1, 1, 0.0)
    assert math.isnan(result.accuracy_low) and math.isnan(result.kappa_high)


# --------------------------------------------------------------------------- PPI


PREDICTIONS = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.5, "f": 0.1}
LABELS = {"a": 0.7, "b": 0.8, "c": 0.6}


def test_ppi_mean_by_hand() -> None:
    est = ppi_mean("faithfulness", PREDICTIONS, LABELS)
    # Judge mean over all N = 6: (0.9 + 0.8 + 0.7 + 0.6 + 0.5 + 0.1) / 6 = 3.6 / 6 = 0.6.
    assert est.judge_mean == pytest.approx(0.6)
    # The first term runs over the 3 unlabelled items d, e, f: (0.6 + 0.5 + 0.1) / 3 = 0.4.
    # Rectifier f - y on the n = 3 labelled items: 0.2, 0.0, 0.1; mean 0.1.
    # theta = 0.4 - 0.1 = 0.3.
    assert est.mean == pytest.approx(0.3)
    # var_f over d, e, f: deviations 0.2, 0.1, -0.3 -> squares sum 0.14; / (3 - 1) = 0.07.
    # var_rect: deviations 0.1, -0.1, 0 -> squares sum 0.02; / (3 - 1) = 0.01.
    # half-width = t * sqrt(0.07 / 3 + 0.01 / 3) = t * sqrt(0.08 / 3) = t * sqrt(2/75), t
    # at Welch-Satterthwaite's df = (0.08/3)^2 / ((0.07/3)^2 / 2 + (0.01/3)^2 / 2) = 2.56.
    assert pytest.approx(2.56) == (0.08 / 3) ** 2 / ((0.07 / 3) ** 2 / 2 + (0.01 / 3) ** 2 / 2)
    half = T.ppf(0.975, 2.56) * math.sqrt(2 / 75)  # ≈ 3.515 x 0.1633 ≈ 0.574
    assert est.ci_low == pytest.approx(0.3 - half)
    assert est.ci_high == pytest.approx(0.3 + half)
    # Humans alone: mean (0.7 + 0.8 + 0.6) / 3 = 0.7; sd = sqrt(0.02 / 2) = 0.1.
    assert est.human_mean == pytest.approx(0.7)
    human_half = T_975_2 * 0.1 / math.sqrt(3)  # ≈ 0.2484 (z gave 0.1132)
    assert est.human_ci_low == pytest.approx(0.7 - human_half)
    assert est.human_ci_high == pytest.approx(0.7 + human_half)
    assert (est.n_judged, est.n_labeled, est.metric) == (6, 3, "faithfulness")
    assert est.as_dict()["mean"] == pytest.approx(0.3)
    # Clipped to the metric's range: [0.3 - 0.574, 0.3 + 0.574] -> [0, 0.874].
    clipped = ppi_mean("faithfulness", PREDICTIONS, LABELS, bounds=(0.0, 1.0))
    assert clipped.ci_low == 0.0 and clipped.ci_high == pytest.approx(0.3 + half)


# The review: a judge that scored every unlabelled item 1.0 but failed on 9 of the 10
# labelled ones (a failure predicts the midpoint, 0.5), where the humans said 1.0.
FAILED_ON_THE_LABELLED = (
    {**{f"u{i}": 1.0 for i in range(20)}, **{f"l{i}": 0.5 for i in range(9)}, "l9": 1.0},
    {f"l{i}": 1.0 for i in range(10)},
)
OUTSIDE = (
    "outside the metric's range [0, 1]: not a possible mean (too few labels, or the "
    "labelled items unlike the rest)"
)


def test_ppi_mean_outside_the_range_is_flagged_not_clipped() -> None:
    est = ppi_mean("faithfulness", *FAILED_ON_THE_LABELLED, bounds=(0.0, 1.0))
    # theta = 1.0 (the unlabelled mean) - mean(nine -0.5 and one 0) = 1.0 + 0.45 = 1.45.
    # var_f = 0; var_rect: deviations nine -0.05, one +0.45 -> 9 x 0.0025 + 0.2025 = 0.225,
    # / 9 = 0.025; half = t(0.975, df) * sqrt(0.025 / 10) = t * 0.05, df = 9 (the rectifier's
    # alone): 2.2622 x 0.05 = 0.1131. Clipped to [0, 1] it read 1.000 [1.000, 1.000].
    half = T.ppf(0.975, 9) * 0.05
    assert est.mean == pytest.approx(1.45)
    assert (est.ci_low, est.ci_high) == (pytest.approx(1.45 - half), pytest.approx(1.45 + half))
    assert est.flag == OUTSIDE and est.as_dict()["flag"] == OUTSIDE
    # The labels (all 1.0) have no variance: no CI, and their mean is in the range.
    assert est.human_mean == 1.0 and math.isnan(est.human_ci_low)
    # At the low end: unlabelled 0, 0.02, ... (mean 0.01); labelled judged 0.9 where the
    # humans said 0.1, 0 (rectifiers 0.8, 0.9: mean 0.85): theta = 0.01 - 0.85 = -0.84.
    low = ppi_mean(
        "context_recall",
        {**{f"u{i}": 0.02 * (i % 2) for i in range(20)}, **{f"l{i}": 0.9 for i in range(6)}},
        {f"l{i}": 0.1 * (1 - i % 2) for i in range(6)},
        bounds=(0.0, 1.0),
    )
    assert low.mean == pytest.approx(-0.84) and low.ci_high < 0 and low.flag == OUTSIDE
    # A sum's rounding past a bound is no flag: (0 + 0.4 + 0.8) / 3 - (0.2 - 0.8) = 1 in
    # decimals, 1.0000000000000002 in floating point.
    edge = {"a": 0.0, "b": 0.4, "c": 0.8, "d": 0.2}
    unclipped = ppi_mean("faithfulness", edge, {"d": 0.8})
    assert unclipped.mean > 1.0 and unclipped.flag is None  # no bounds: nothing is outside
    clipped = ppi_mean("faithfulness", edge, {"d": 0.8}, bounds=(0.0, 1.0))
    assert clipped.mean == 1.0 and clipped.flag is None


def test_ppi_mean_with_every_item_labelled_is_the_labels_mean() -> None:
    est = ppi_mean("faithfulness", {"a": 0.9, "b": 0.1, "c": 0.5}, {"a": 1.0, "b": 0.0, "c": 1.0})
    # No unlabelled item: theta = the labels' mean 2/3, with the labels' own CI:
    # sd = sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3).
    assert est.mean == pytest.approx(2 / 3) == est.human_mean
    assert est.ci_high - est.mean == pytest.approx(T_975_2 * math.sqrt(1 / 3) / math.sqrt(3))
    assert (est.ci_low, est.ci_high) == (est.human_ci_low, est.human_ci_high)


def test_ppi_mean_without_variance_has_no_ci() -> None:
    # Identical labels and a constant judge: a zero-width interval would claim certainty.
    est = ppi_mean("faithfulness", {"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 1.0, "b": 1.0})
    assert est.mean == 1.0 and math.isnan(est.ci_low) and math.isnan(est.human_ci_low)
    assert est.as_dict()["ci_low"] is None


def test_ppi_mean_with_one_unlabelled_item_takes_the_judges_spread() -> None:
    est = ppi_mean("faithfulness", {**LABELS, "a": 0.9, "b": 0.8, "c": 0.7, "d": 0.2}, LABELS)
    # theta = 0.2 (d's score) - 0.1 (the rectifiers 0.2, 0.0, 0.1) = 0.1.
    assert est.mean == pytest.approx(0.1)
    # One unlabelled score has no variance: var_f over all four judge scores 0.9, 0.8, 0.7,
    # 0.2 (mean 0.65; squares 0.0625 + 0.0225 + 0.0025 + 0.2025 = 0.29; / 3), var_rect 0.01:
    # half = t * sqrt(0.29/3 / 1 + 0.01 / 3) = t * sqrt(0.1), not t * sqrt(0.01 / 3); df
    # = 0.1^2 / ((0.29/3)^2 / 3 + (0.01/3)^2 / 2) = 3.2 (the judge's spread has 4 - 1).
    df = 0.1**2 / ((0.29 / 3) ** 2 / 3 + (0.01 / 3) ** 2 / 2)
    assert df == pytest.approx(3.2, abs=0.01)
    assert est.ci_high - est.mean == pytest.approx(T.ppf(0.975, df) * math.sqrt(0.1))


def test_ppi_mean_level_changes_the_width() -> None:
    est = ppi_mean("faithfulness", PREDICTIONS, LABELS, level=0.9)
    assert est.ci_high - est.mean == pytest.approx(T.ppf(0.95, 2.56) * math.sqrt(2 / 75))


def test_ppi_mean_with_one_label_has_no_ci() -> None:
    est = ppi_mean("faithfulness", PREDICTIONS, {"f": 0.3})
    # Unlabelled a..e: mean (0.9 + 0.8 + 0.7 + 0.6 + 0.5) / 5 = 0.7; theta = 0.7 - (0.1 - 0.3)
    # = 0.9.
    assert est.mean == pytest.approx(0.9)
    assert math.isnan(est.ci_low) and math.isnan(est.human_ci_high)
    assert est.human_mean == pytest.approx(0.3)


def test_ppi_mean_rejects_unknown_and_empty_labels() -> None:
    with pytest.raises(ConfigError, match=r"'zz'.*labels must be for items of this run"):
        ppi_mean("faithfulness", PREDICTIONS, {"a": 0.5, "zz": 1.0})
    with pytest.raises(ConfigError, match="no human labels for metric 'faithfulness'"):
        ppi_mean("faithfulness", PREDICTIONS, {})
    with pytest.raises(ConfigError, match="level"):
        ppi_mean("faithfulness", PREDICTIONS, LABELS, level=1.0)


def test_ppi_corrects_a_biased_judge() -> None:
    rng = np.random.default_rng(2023)
    big_n, n = 500, 100
    truth = rng.beta(2, 5, size=big_n)  # mean 2/7 ≈ 0.29, rarely above 0.75
    judge = np.clip(truth + 0.2 + rng.normal(0, 0.05, size=big_n), 0, 1)
    ids = [f"q{i}" for i in range(big_n)]
    labelled = rng.choice(big_n, size=n, replace=False)
    est = ppi_mean(
        "faithfulness",
        dict(zip(ids, judge.tolist(), strict=True)),
        {ids[i]: float(truth[i]) for i in labelled},
    )
    true_mean = float(truth.mean())
    assert est.judge_mean - true_mean == pytest.approx(0.2, abs=0.02)
    assert not est.ci_low <= est.judge_mean <= est.ci_high
    assert est.ci_low <= true_mean <= est.ci_high
    # The judge's scores make the CI narrower than the humans' alone.
    assert est.ci_high - est.ci_low < est.human_ci_high - est.human_ci_low


# --------------------------------------------------------------------------- label files


def test_load_labels_csv(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text(
        "item_id,metric,value,note\n"
        "q1,faithfulness,1,ok\n"
        "q2,faithfulness,0.5,\n"
        "q1,answer_relevancy,-0.25,cosine\n",
        encoding="utf-8",
    )
    labels = load_labels(path)
    assert labels == [
        Label("q1", "faithfulness", 1.0),
        Label("q2", "faithfulness", 0.5),
        Label("q1", "answer_relevancy", -0.25),
    ]
    assert labels_by_metric(labels) == {
        "faithfulness": {"q1": 1.0, "q2": 0.5},
        "answer_relevancy": {"q1": -0.25},
    }


def test_load_labels_yaml_and_json(tmp_path: Path) -> None:
    listed = tmp_path / "labels.yaml"
    listed.write_text(
        "- {item_id: q1, metric: faithfulness, value: 0.75}\n"
        "- {item_id: 7, metric: faithfulness, value: 0}\n",
        encoding="utf-8",
    )
    expected = [Label("q1", "faithfulness", 0.75), Label("7", "faithfulness", 0.0)]
    assert load_labels(listed) == expected
    keyed = tmp_path / "labels.yml"
    keyed.write_text(
        "labels:\n  - item_id: q1\n    metric: faithfulness\n    value: 0.75\n"
        "  - item_id: 7\n    metric: faithfulness\n    value: 0\n",
        encoding="utf-8",
    )
    assert load_labels(keyed) == expected
    as_json = tmp_path / "labels.json"
    as_json.write_text(
        json.dumps({"labels": [{"item_id": "q1", "metric": "faithfulness", "value": 0.75}]}),
        encoding="utf-8",
    )
    assert load_labels(as_json) == expected[:1]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("item_id,value\nq1,0.5\n", r"row 1 \(header\) lacks column 'metric'.*header line"),
        ("item_id,metric,value\nq1,faithfulness,0.5\nq2,,1\n", r"row 2 .*'metric' is missing"),
        ("item_id,metric,value\nq1,faithfulness,\n", r"row 1 .*'value' is missing.*give every"),
        ("item_id,metric,value\nq1,faithfulness,yes\n", r"row 1 .*'yes' is not a number.*write"),
        ("item_id,metric,value\nq1,faithfulness,1.5\n", r"row 1 .*outside \[-1, 1\]"),
        ("item_id,metric,value\nq1,faithfulness,nan\n", r"row 1 .*outside \[-1, 1\]"),
        (
            "item_id,metric,value\nq1,faithfulness,1\nq2,faithfulness,1\nq1,faithfulness,0\n",
            r"row 3 \(line 4\) repeats item_id 'q1'.*from row 1 \(line 2\); keep one label",
        ),
        ("item_id,metric,value\n", "holds no labels"),
    ],
)
def test_load_labels_csv_errors(tmp_path: Path, body: str, match: str) -> None:
    _fails(tmp_path / "labels.csv", body, match)


def _fails(path: Path, body: str, match: str) -> None:
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as caught:
        load_labels(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("- {item_id: q1, value: 0.5}\n", r"entry 1: 'metric' is missing; give every entry"),
        ("- {item_id: q1, metric: m, value: [1]}\n", r"entry 1: .* is not a number"),
        ("- {item_id: q1, metric: m, value: true}\n", r"entry 1: .* is not a number"),
        ("- {item_id: q1, metric: m, value: -2}\n", r"entry 1: .*outside \[-1, 1\]"),
        ("- just a string\n", r"entry 1: expected a mapping"),
        ("{items: []}\n", r"expected a list of \{item_id, metric, value\}"),
        (
            "- {item_id: q1, metric: m, value: 1}\n- {item_id: q1, metric: m, value: 0}\n",
            r"entry 2 repeats item_id 'q1' with metric 'm' from entry 1",
        ),
        ("- [unclosed\n", "is not valid YAML"),
    ],
)
def test_load_labels_yaml_errors(tmp_path: Path, body: str, match: str) -> None:
    _fails(tmp_path / "labels.yaml", body, match)


def test_load_labels_missing_file_and_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found; fix the path"):
        load_labels(tmp_path / "absent.csv")
    odd = tmp_path / "labels.txt"
    odd.write_text("q1 faithfulness 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown extension '\.txt'; use one of \.csv"):
        load_labels(odd)


def test_labels_by_metric_rejects_duplicates() -> None:
    twice = [Label("q1", "m", 1.0), Label("q1", "m", 0.0)]
    with pytest.raises(ConfigError, match="two labels for item 'q1' and metric 'm'"):
        labels_by_metric(twice)


def test_a_few_labels_give_a_t_interval_that_covers() -> None:
    # The attack review: labels 0.9, 0.5, 1.0 gave [0.501, 1.000] with a normal z; by hand,
    # mean 0.8, sd sqrt((0.01 + 0.09 + 0.04) / 2) = sqrt(0.07), t(0.975, 2) = 4.3027:
    # 0.8 +- 4.3027 x 0.26458 / sqrt(3) = 0.8 +- 0.6572 -> [0.1428, 1.4572], clipped at 1.
    labels = {"a": 0.9, "b": 0.5, "c": 1.0}
    est = ppi_mean("faithfulness", {**labels, "d": 0.7}, labels, bounds=(0.0, 1.0))
    assert est.human_ci_low == pytest.approx(0.8 - T_975_2 * math.sqrt(0.07) / math.sqrt(3))
    assert est.human_ci_low == pytest.approx(0.1428, abs=1e-4) and est.human_ci_high == 1.0
    # Coverage of the labels' 95% interval over 4000 draws of 3 labels from a known
    # distribution: about 95% (a normal z covered 79%).
    rng = np.random.default_rng(7)
    truth, covered = 0.6, 0
    for _ in range(4000):
        y = np.clip(rng.normal(truth, 0.2, size=3), -1, 1)
        drawn = {f"q{i}": float(v) for i, v in enumerate(y)}
        e = ppi_mean("faithfulness", {**drawn, "u": 0.5}, drawn)
        covered += e.human_ci_low <= truth <= e.human_ci_high
    assert 0.93 <= covered / 4000 <= 0.97

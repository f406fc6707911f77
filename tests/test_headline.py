"""The one headline cell every surface shows (terminal, report.md, report.html, Prefect):
a CI only from n >= 2, the counts, and no number for a withheld metric."""

from __future__ import annotations

from ragpipe.evaluation.metrics import bootstrap_ci, paired_delta
from ragpipe.evaluation.report import delta_cell, headline_cell
from ragpipe.evaluation.run import stats


def test_cells() -> None:
    many = stats(bootstrap_ci([1.0, 0.0, 1.0, 1.0], 200, 0), failed=1, not_applicable=2)
    low, high = many["ci_low"], many["ci_high"]
    assert headline_cell(many) == f"0.750 [{low:.3f}, {high:.3f}] (n=4, 1 failed, 2 n/a)"
    one = stats(bootstrap_ci([0.883], 200, 0), failed=8, not_applicable=3)
    assert headline_cell(one) == "0.883 (n=1, no CI, 8 failed, 3 n/a)"
    assert headline_cell(stats(bootstrap_ci([], 200, 0), failed=4)) == "no value (n=0, 4 failed)"
    equal = stats(bootstrap_ci([1.0, 1.0, 1.0], 200, 0), not_applicable=1)
    assert headline_cell(equal) == "1.000 (n=3, no CI: all values equal, 1 n/a)"
    # With the metric's range known, all-equal values still bound the mean: 0.025^(1/3) =
    # 0.2924 of the items at least score 1.0, so the mean is at least 0.292.
    bounded = stats(bootstrap_ci([1.0, 1.0, 1.0], 200, 0, bounds=(0.0, 1.0)), not_applicable=1)
    assert headline_cell(bounded) == ("1.000 [0.292, 1.000] (n=3, all equal: range bound, 1 n/a)")
    flagged = stats(bootstrap_ci([0.5, 1.0], 200, 0), flag="judge not calibrated")
    assert headline_cell(flagged).endswith("(n=2); judge not calibrated")
    withheld = stats(
        bootstrap_ci([0.883], 200, 0), failed=8, flag="judge unreliable (kappa 0.00)",
        withheld=True,
    )  # fmt: skip
    assert headline_cell(withheld) == "judge unreliable (kappa 0.00) (n=1, 8 failed)"
    assert "0.883" not in headline_cell(withheld)


def test_cells_of_summaries_written_before_the_counts() -> None:
    old = {"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75, "n": 10}
    assert headline_cell(old) == "0.500 [0.250, 0.750] (n=10)"


def test_delta_cells() -> None:
    # Deltas +1, 0, +1, +1: mean +0.750; a sign flip reaches |mean| 0.75 only when the three
    # non-zero deltas keep one sign, 2 of 8 patterns: p about 0.25.
    moved = paired_delta([0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], 200, 0, 10000).as_dict()
    low, high, p = moved["ci_low"], moved["ci_high"], moved["p_value"]
    assert abs(p - 0.25) < 0.02 and low < 0.75 < high
    assert delta_cell(moved) == f"+0.750 [{low:+.3f}, {high:+.3f}] p={p:.3f}"
    same = paired_delta([0.5, 0.2, 0.9], [0.5, 0.2, 0.9], 200, 0).as_dict()  # every delta 0
    assert delta_cell(same) == "+0.000 (n=3, no CI: every delta equal)"
    one = paired_delta([0.25], [1.0], 200, 0).as_dict()
    assert delta_cell(one) == "+0.750 (n=1, no CI)"


def test_all_equal_values_bound_the_mean_by_hand() -> None:
    import math

    import pytest

    from ragpipe.evaluation.metrics import EQUAL_BOUND

    # 75 items all at 1.0 (the demo's recall@5): the share at 1.0 is at least
    # 0.025^(1/75) = exp(ln 0.025 / 75) = 0.95201 (Clopper-Pearson, 75 of 75).
    full = bootstrap_ci([1.0] * 75, 200, 0, bounds=(0.0, 1.0))
    assert (full.mean, full.high, full.method) == (1.0, 1.0, EQUAL_BOUND)
    assert full.low == pytest.approx(math.exp(math.log(0.025) / 75))
    assert full.low == pytest.approx(0.95201, abs=1e-5)
    # All at 0 (degenerate on every answer): [0, 1 - 0.952].
    none = bootstrap_ci([0.0] * 75, 200, 0, bounds=(0.0, 1.0))
    assert (none.low, none.high) == (0.0, pytest.approx(1 - 0.95201, abs=1e-5))
    # All 0.8 in [-1, 1] (answer relevancy), n = 4: L = 0.025^(1/4) = 0.39764;
    # [-1 + 1.8 L, 1 - 0.2 L] = [-0.28425, 0.92047].
    mid = bootstrap_ci([0.8] * 4, 200, 0, bounds=(-1.0, 1.0))
    assert mid.low == pytest.approx(-0.28425, abs=1e-5)
    assert mid.high == pytest.approx(0.92047, abs=1e-5)
    assert mid.shown and not mid.zero_width
    # Without a range: no CI, as before (a delta of 0 on every query).
    assert bootstrap_ci([0.0] * 4, 200, 0).zero_width

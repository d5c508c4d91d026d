"""benchmarks/fidelity.py: the 'measured vs itself' ceiling keeps a round's runs together, and `round_noise`
finds where the noise is (within a round or between rounds)."""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def fidelity(benchmark_script):
    return benchmark_script("fidelity")


def _runs(rng, placements=30, rounds=3, per=3, between=0.10, within=0.01):
    """Step times kept round after round ([placement, rounds * per]): true times 1.00-1.29 s, each (placement,
    round) shifted by one draw of `between` (the load of that moment), each run by `within`."""
    true = 1.0 + 0.01 * np.arange(placements)
    shift = rng.normal(0.0, between, (placements, rounds, 1))
    runs = np.exp(np.log(true)[:, None, None] + shift + rng.normal(0.0, within, (placements, rounds, per)))
    return runs.reshape(placements, rounds * per)


def test_ceiling_by_rounds_is_below_the_ceiling_by_runs_when_runs_of_a_round_share_the_load(fidelity):
    runs = _runs(np.random.default_rng(0), between=0.05)
    _, by_runs = fidelity.retest_spearman(runs)
    _, by_rounds = fidelity.retest_spearman(runs, rounds=3)
    # splitting a round's runs between the halves puts the same load draws in both: they agree too well
    assert by_runs > 0.95
    assert by_rounds < by_runs - 0.04
    # with no load shared within a round, the two agree (one noise, split either way)
    flat = _runs(np.random.default_rng(1), rounds=9, per=1, between=0.0, within=0.05)
    _, a = fidelity.retest_spearman(flat)
    _, b = fidelity.retest_spearman(flat, rounds=9)
    assert abs(a - b) < 0.05


def test_round_noise_separates_within_and_between(fidelity):
    n = fidelity.round_noise(_runs(np.random.default_rng(2), rounds=5, per=4, between=0.08, within=0.02), 5)
    assert n["rounds"] == 5 and n["runs_per_round"] == 4
    assert n["within_round"] == pytest.approx(0.02, rel=0.2)
    assert n["between_rounds"] == pytest.approx(np.sqrt(0.08 ** 2 + 0.02 ** 2 / 4), rel=0.25)
    # columns that do not split into the rounds given: no figure, rather than a wrong one
    assert fidelity.round_noise(np.ones((4, 10)), 3) is None
    assert np.isnan(fidelity.round_noise(np.ones((4, 3)), 3)["within_round"])   # one run per round: no within

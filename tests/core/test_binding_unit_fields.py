"""Fields added for privacy units leave the noise binding of a run without a unit as it was."""

from beam_dp.beam.erm import MultiResolutionParams
from beam_dp.beam.online import OnlineLearnerParams
from beam_dp.core.budget import JobBudget
from beam_dp.core.group_privacy import RecordUnit
from beam_dp.core.noise_binding import calibration_binding

# bindings of these params as written before the unit fields existed (the noise of earlier runs)
SHARES = JobBudget(1.0, 1e-6).split({"m": "approx", "n": "pure"})
PINNED = [
    (MultiResolutionParams(n_features=2, block=8, epsilon=1.0), "b1:15dcfed81c0b1af4d6bc16976e0b16ab"),
    (MultiResolutionParams(n_features=2, block=8, **SHARES["n"].params()), "b1:fd2d5bfac43cf57ccec478abb3080e6b"),
    (OnlineLearnerParams(dim=3, constraint="simplex", epsilon=1.0, window=8), "b1:a6bdab071d5e76b2c0b94f3a1e833c52"),
    (OnlineLearnerParams(dim=3, constraint="simplex", window=8, **SHARES["n"].params()),
     "b1:d8342647d8c011dd317c769f7512f1d7"),
]


def test_a_run_without_a_unit_keeps_its_binding():
    assert [calibration_binding(params) for params, _ in PINNED] == [binding for _, binding in PINNED]


def test_a_unit_level_run_is_bound_apart():
    from beam_dp.beam.shell.unit_records import with_record_unit

    params = PINNED[0][0]
    bindings = {calibration_binding(with_record_unit(params, RecordUnit("user", k))) for k in (2, 3)}
    assert len(bindings) == 2 and PINNED[0][1] not in bindings

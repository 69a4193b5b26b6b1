"""Parameter fuzz (issue 18): every public params class with extreme values in every numeric field (one
field at a time, then hypothesis-drawn pairs and triples). Each case must end as either

* a ``ValueError`` at construction whose message names a changed field (or quotes its value), or
* a params object that works: for the sums family one mechanism step on a zero input releases finite
  values (the values that passed validation and then broke, e.g. ``clip_bound=1e308``, are the bug).

Any other exception is a failure. The number of cases is counted, printed (``-s``) and asserted.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from beam_dp.beam.sums import ContinualCountParams, _VectorSumParams
from beam_dp.core import NoiseSource
from tests.conftest import TEST_KEY
from tests.reliability.param_cases import CASES, EXTREMES

COMBOS_PER_CLASS = int(os.environ.get("BEAM_DP_PARAM_FUZZ_COMBOS", "1200"))
COUNTS: dict[str, int] = {}


def _mentions(message: str, overrides: dict) -> bool:
    texts = set(overrides)
    for value in overrides.values():
        texts |= {repr(value), str(value)}
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                texts.add(f"{float(value):g}")
            except OverflowError:
                pass
    # a Gaussian certification refusal states the (epsilon, delta) it could not certify ("(0.25, 1e-06)-DP")
    return any(t and t in message for t in texts) or ")-DP" in message


def _works(params) -> None:
    """A sums-family params object must run: one step on zeros releases finite values."""
    if not isinstance(params, (_VectorSumParams, ContinualCountParams)):
        return
    mechanism = params.build_mechanism()
    with np.errstate(over="raise", invalid="raise"):
        state = mechanism.init_state("s")
        _, releases = mechanism.step(state, mechanism.clip_and_sum(np.zeros((1, mechanism.dim))), NoiseSource(TEST_KEY))
    assert releases and all(np.all(np.isfinite(np.asarray(r.value, dtype=np.float64))) for r in releases)


def check_case(case, overrides: dict) -> str:
    """Build ``case`` with ``overrides``; return the outcome ("refused" or "works") or fail the test."""
    try:
        params = case.make(**overrides)
    except ValueError as exc:
        assert _mentions(str(exc), overrides), f"{case.name}{overrides}: the message names no field: {exc}"
        assert "\n" not in str(exc).strip()
        return "refused"
    _works(params)
    return "works"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_extreme_field_is_refused_or_works(case):
    if case.name.startswith("Lifelong"):
        pytest.importorskip("torch")
    outcomes = [check_case(case, {field: value}) for field in case.fields for value in EXTREMES]
    COUNTS[f"single {case.name}"] = len(outcomes)
    assert "refused" in outcomes and "works" in outcomes


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_extreme_pairs_and_triples_are_refused_or_work(case):
    if case.name.startswith("Lifelong"):
        pytest.importorskip("torch")
    n = 0

    @settings(max_examples=COMBOS_PER_CLASS, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(fields=st.lists(st.sampled_from(case.fields), min_size=2, max_size=3, unique=True),
           data=st.data())
    def fuzz(fields, data):
        nonlocal n
        overrides = {f: data.draw(st.sampled_from(EXTREMES), label=f) for f in fields}
        check_case(case, overrides)
        n += 1

    fuzz()
    COUNTS[f"combos {case.name}"] = n
    assert n >= COMBOS_PER_CLASS // 2


def test_the_parameter_campaign_is_large_enough():
    """Counts the single-field and combination cases (run after the two tests above in this file)."""
    single = sum(len(c.fields) * len(EXTREMES) for c in CASES)
    combos = COMBOS_PER_CLASS * len(CASES)
    print(f"\nparameter fuzz cases: {single} single-field + up to {combos} combinations; "
          f"ran {sum(COUNTS.values())}")
    assert single + combos >= 20_000

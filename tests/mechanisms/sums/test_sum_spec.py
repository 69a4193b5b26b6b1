"""One parameter set for every continual sum (``SumSpec``): one refusal of a bad value whatever the
layer (mechanism constructors, keyword or spec form, and the Beam params), the two forms build the
same mechanism, and the params' noise bindings (hence their noise) stay pinned."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from beam_dp.beam.sums import ContinualCountParams, ContinualSumParams, WindowedSumParams
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.flink.params import FlinkReleaseParams
from beam_dp.mechanisms.base import SumSpec
from beam_dp.mechanisms.sums.blt import BLTSum
from beam_dp.mechanisms.sums.factory import make_counter
from beam_dp.mechanisms.sums.honaker import HonakerTreeSum
from beam_dp.mechanisms.sums.pure import KaryTreeSum
from beam_dp.mechanisms.sums.snapping import SnappedSum
from beam_dp.mechanisms.sums.toeplitz import ToeplitzSqrtSum
from beam_dp.mechanisms.sums.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum

BAD = (True, math.nan, math.inf, 0, -1, "1")
GAUSS = dict(noise="gaussian", delta=1e-6)


def _snapped(**kw):
    bound = kw.pop("clip_bound")
    return SnappedSum(lambda r: HybridTreeSum(clip_bound=r, **kw), clip_bound=bound, granularity=0.5)


#: every sum mechanism: (constructor, its own keywords, the noise laws to try it under)
MECHANISMS = {
    "binary": (BinaryTreeSum, dict(horizon=8), ("gamma", "gaussian")),
    "hybrid": (HybridTreeSum, {}, ("gamma", "gaussian")),
    "doubling": (DoublingTreeSum, {}, ("gamma", "gaussian")),
    "window": (WindowTreeSum, dict(window=4), ("gamma", "gaussian")),
    "honaker": (HonakerTreeSum, dict(levels=3), ("gamma", "gaussian")),
    "kary": (KaryTreeSum, dict(horizon=8), ("gamma",)),
    "blt": (BLTSum, dict(horizon=8), ("gaussian",)),
    "toeplitz": (ToeplitzSqrtSum, dict(horizon=8), ("gaussian",)),
}
#: each mechanism's own integer parameters (every value of BAD is invalid for them)
OWN_COUNTS = {"binary": ("horizon",), "window": ("window",), "honaker": ("arity", "levels"), "kary": ("horizon",),
              "blt": ("horizon",), "toeplitz": ("horizon",)}


def _valid(noise: str) -> dict:
    return dict(dim=2, epsilon=1.0, clip_bound=1.0, **(GAUSS if noise == "gaussian" else {}))


def _mechanism_cases():
    for name, (make, own, laws) in MECHANISMS.items():
        for noise in laws:
            yield pytest.param(make, own, noise, ("sensitivity",), id=f"{name}-{noise}")
    yield pytest.param(_snapped, {}, "gamma", (), id="snapped-gamma")


@pytest.mark.parametrize("make,own,noise,alternatives", list(_mechanism_cases()))
@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_shared_value_is_refused_by_every_mechanism(make, own, noise, alternatives, bad):
    fields = ["dim", "epsilon", "clip_bound"] + ["delta"] * (noise == "gaussian")  # δ = 0 is fine for pure laws
    for field in fields:
        with pytest.raises(ValueError, match=field):
            make(**own, **{**_valid(noise), field: bad})
    given = {k: v for k, v in _valid(noise).items() if k != "clip_bound"}
    for field in alternatives:  # Δ₂ = 2R in place of R
        with pytest.raises(ValueError, match=field):
            make(**own, **given, **{field: bad})


@pytest.mark.parametrize("name", sorted(OWN_COUNTS))
@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_own_count_is_refused(name, bad):
    make, own, laws = MECHANISMS[name]
    for field in OWN_COUNTS[name]:
        with pytest.raises(ValueError, match=field):
            make(**{**own, field: bad}, **_valid(laws[0]))


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_the_params_refuse_the_same_values(bad):
    for field in ("dim", "epsilon", "clip_bound", "horizon"):
        with pytest.raises(ValueError, match=field):
            ContinualSumParams(block_size=1, **{field: bad})
    with pytest.raises(ValueError, match="delta"):
        ContinualSumParams(block_size=1, noise="gaussian", delta=bad)
    for field in ("dim", "epsilon", "clip_bound", "window"):
        with pytest.raises(ValueError, match=field):
            WindowedSumParams(block_size=1, **{"window": 4, field: bad})
    for field in ("epsilon", "horizon"):
        with pytest.raises(ValueError, match=field):
            ContinualCountParams(block_size=1, **{field: bad})


def test_the_spec_form_builds_the_keyword_form():
    noise = NoiseSource(bytes(range(32)))
    rng = np.random.default_rng(0)
    for name, (make, own, laws) in MECHANISMS.items():
        for law in laws:
            keywords = make(**own, **_valid(law), calibration="analytic")
            spec = make(SumSpec(**_valid(law), calibration="analytic"), **own)
            assert spec.spec == keywords.spec, name
            s1, s2 = keywords.init_state("s"), spec.init_state("s")
            for _ in range(5):
                block = rng.normal(size=(3, 2))
                (s1, r1), (s2, r2) = keywords.step(s1, block, noise), spec.step(s2, block, noise)
                np.testing.assert_array_equal(r1[0].value, r2[0].value)
                assert r1[0].epsilon_spent == r2[0].epsilon_spent


def test_spec_rules():
    spec = SumSpec.of(dim=3, epsilon=1, sensitivity=3)
    assert (spec.clip_bound, spec.sensitivity, spec.epsilon, spec.noise, spec.calibration) == (1.5, 3.0, 1.0, "gamma", "paper")
    assert isinstance(spec.epsilon, float) and isinstance(spec.dim, int)
    assert SumSpec(**spec.keywords()) == spec
    for bad in (dict(), dict(clip_bound=1.0, sensitivity=2.0)):
        with pytest.raises(ValueError, match="exactly one"):
            SumSpec.of(dim=1, epsilon=1.0, **bad)
    for bad in (dict(noise="laplace"), dict(noise=True), dict(calibration="exact"), dict(delta=1e-6),  # gamma: δ = 0
                dict(noise="gaussian"), dict(noise="gaussian", delta=1.0),
                dict(noise="discrete_laplace", dim=2), dict(noise="discrete_laplace", clip_bound=1.5)):
        with pytest.raises(ValueError):
            SumSpec(**{"dim": 1, "epsilon": 1.0, "clip_bound": 1.0, **bad})
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.epsilon = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="not both"):
        HybridTreeSum(spec, dim=3)


def test_each_mechanism_takes_only_its_noise_laws_and_fixed_calibrations():
    for make, own, bad in ((KaryTreeSum, {}, "gaussian"), (BLTSum, {}, "gamma"), (WindowTreeSum, dict(window=4), "discrete_laplace"),
                           (HonakerTreeSum, dict(levels=2), "discrete_laplace")):
        spec = SumSpec(dim=1, epsilon=1.0, clip_bound=1.0, noise=bad, delta=1e-6 if bad == "gaussian" else 0.0)
        with pytest.raises(ValueError, match="does not support"):
            make(spec, **own)
    paper = SumSpec(dim=1, epsilon=1.0, clip_bound=1.0, noise="gaussian", delta=1e-6, calibration="paper")
    assert HonakerTreeSum(paper, levels=3).calibration == BLTSum(paper).calibration == "analytic"  # always exact
    assert HybridTreeSum(paper).calibration == "paper"
    assert WindowTreeSum(dim=1, epsilon=1.0, clip_bound=1.0, window=2).calibration == "analytic"  # its default
    assert BLTSum(dim=1, epsilon=1.0, delta=1e-6, clip_bound=1.0).noise_law == "gaussian"  # its only law


#: the noise bindings of a few params, as the previous release computed them (their class names and fields set the
#: noise: never change them; a Flink job's factory is bound by its code and its module's first path
#: (``beam_dp.core.state.FORMER_MODULES``), so editing ``make_counter`` changes the noise of ``beam_dp.flink.run``)
PINNED = {
    "b1:7cac2263e4b01c39716e658b537dc45a": FlinkReleaseParams(block_size=1, build=functools.partial(
        make_counter, "auto", public_end=50, dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian")),
    "b1:925df33ba9afc6b923aa0e171958de38": ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.5, block_size=1),
    "b1:c9e0bbfff7a81d30b61ddf3b63b2d66b": ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, block_size=1, counter="tree",
                                                              horizon=64, calibration="paper", **GAUSS),
    "b1:3e8178433b3c0e812b8440e6b0f491f5": ContinualCountParams(epsilon=1.0, block_size=1),
    "b1:9c9d78ec8d677c3c8b8047d7ae11795c": ContinualCountParams(epsilon=1.0, block_size=1, noise="discrete_laplace"),
    "b1:dcdfbf163dc056a3f7997575899c3c8c": WindowedSumParams(dim=2, epsilon=1.0, clip_bound=1.0, block_size=1, window=8),
    "b1:b49465c9f2d6880803c7d2855ba9e75a": WindowedSumParams(dim=3, epsilon=1.0, clip_bound=1.0, block_size=1, window=5,
                                                             calibration="paper", **GAUSS),
}


@pytest.mark.parametrize("binding", sorted(PINNED))
def test_params_bindings_are_pinned(binding):
    assert calibration_binding(PINNED[binding]) == binding

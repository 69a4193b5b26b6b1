"""Continual counters that beat the binary tree. Pure mechanisms, no Beam imports.

* :class:`HonakerTreeSum` (``honaker.py``): k-ary tree with online Honaker estimation, K-norm or Gaussian;
* :class:`KaryTreeSum` (``pure.py``): the fitted pure-ε k-ary Honaker tree (default for pure ε; its
  digits, variances and fit in ``kary_math.py``);
* :class:`ToeplitzSqrtSum` (``toeplitz.py``): square-root Toeplitz factorization, Gaussian;
* :class:`BLTSum` (``blt.py``): 4-buffer BLT factorization, Gaussian (default for (ε, δ));
* :func:`make_counter` (``factory.py``): one of them (or the trees) by name.

Every one takes the same :class:`SumSpec` (``dim``, ``epsilon``, ``delta``, ``clip_bound``, ``noise``,
``calibration``; checked by ``beam_dp.core.limits``), or its fields as keywords.

Exports are loaded on first use (``beam_dp.lazy``): importing the package imports none of its modules.
"""

from beam_dp.lazy import lazy_exports

_EXPORTS = {
    "SumSpec": "beam_dp.mechanisms.base",
    "Participation": "beam_dp.mechanisms.sums.participation",
    "UnitSensitivity": "beam_dp.mechanisms.sums.participation",
    "unit_sensitivity": "beam_dp.mechanisms.sums.participation",
    "BLT": "beam_dp.mechanisms.sums.blt_math",
    "fit_blt": "beam_dp.mechanisms.sums.blt_math",
    "BLTState": "beam_dp.mechanisms.sums.blt",
    "BLTSum": "beam_dp.mechanisms.sums.blt",
    "COUNTERS": "beam_dp.mechanisms.sums.factory",
    "make_counter": "beam_dp.mechanisms.sums.factory",
    "resolve_counter": "beam_dp.mechanisms.sums.factory",
    "HonakerTreeState": "beam_dp.mechanisms.sums.honaker",
    "HonakerTreeSum": "beam_dp.mechanisms.sums.honaker",
    "KaryFit": "beam_dp.mechanisms.sums.kary_math",
    "KaryTreeSum": "beam_dp.mechanisms.sums.pure",
    "fit_kary": "beam_dp.mechanisms.sums.kary_math",
    "ToeplitzSqrtState": "beam_dp.mechanisms.sums.toeplitz",
    "ToeplitzSqrtSum": "beam_dp.mechanisms.sums.toeplitz",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Continual counters that beat the binary tree (issue 7). Pure mechanisms, no Beam imports.

* :class:`HonakerTreeSum` (``honaker.py``): k-ary tree with online Honaker estimation, K-norm or Gaussian;
* :class:`KaryTreeSum` (``pure.py``): the fitted pure-ε k-ary Honaker tree (default for pure ε);
* :class:`ToeplitzSqrtSum` (``toeplitz.py``): square-root Toeplitz factorization, Gaussian;
* :class:`BLTSum` (``blt.py``): 4-buffer BLT factorization, Gaussian (default for (ε, δ));
* :func:`make_counter` (``factory.py``): one of them (or the trees) by name.
"""

from beam_dp.mechanisms.counters.blt import BLTState, BLTSum
from beam_dp.mechanisms.counters.blt_math import BLT, fit_blt
from beam_dp.mechanisms.counters.factory import COUNTERS, make_counter, resolve_counter
from beam_dp.mechanisms.counters.honaker import HonakerTreeState, HonakerTreeSum
from beam_dp.mechanisms.counters.pure import KaryFit, KaryTreeSum, fit_kary
from beam_dp.mechanisms.counters.toeplitz import ToeplitzSqrtState, ToeplitzSqrtSum

__all__ = [
    "BLT",
    "BLTState",
    "BLTSum",
    "COUNTERS",
    "HonakerTreeState",
    "HonakerTreeSum",
    "KaryFit",
    "KaryTreeSum",
    "ToeplitzSqrtState",
    "ToeplitzSqrtSum",
    "fit_blt",
    "fit_kary",
    "make_counter",
    "resolve_counter",
]

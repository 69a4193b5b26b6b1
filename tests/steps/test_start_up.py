"""A one-second start: ``import beam_dp.beam`` loads no family and no heavy dependency (issue 26.2).

Each check runs in a new process, since this test session has long imported everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("scipy.optimize", "scipy.stats", "torch")


def _loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    probe = f"import sys; {code}; print(','.join(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [m for m in done.stdout.strip().split(",") if m]


@pytest.mark.parametrize("package", ["beam_dp.beam", "beam_dp.mechanisms", "beam_dp.mechanisms.sums", "beam_dp.core",
                                     "beam_dp.io"])
def test_importing_a_package_loads_no_heavy_dependency(package):
    assert _loaded_after(f"import {package}", HEAVY) == []


def test_a_job_loads_only_what_it_uses():
    # the main job's transform and its default counter: neither the other families nor the optimisers
    code = ("from beam_dp.beam import ContinualSum, ContinualSumParams; "
            "from beam_dp.mechanisms.sums import make_counter; "
            "make_counter('blt', noise='gaussian', horizon=200, dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0)")
    families = ("beam_dp.beam.erm", "beam_dp.beam.lifelong", "beam_dp.beam.online", "beam_dp.beam.growing_db",
                "beam_dp.mechanisms.online.convex_sets", "beam_dp.mechanisms.erm")
    assert _loaded_after(code, HEAVY + families) == []


def test_lazy_exports_resolve_every_name():
    import beam_dp.beam
    import beam_dp.core
    import beam_dp.io
    import beam_dp.mechanisms
    import beam_dp.mechanisms.sums

    for package in (beam_dp.beam, beam_dp.core, beam_dp.io, beam_dp.mechanisms, beam_dp.mechanisms.sums):
        assert set(package.__all__) <= set(dir(package))
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
        with pytest.raises(AttributeError, match="no attribute"):
            _ = package.NoSuchName

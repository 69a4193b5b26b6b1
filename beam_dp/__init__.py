"""beam_dp: continual differentially private releases from unbounded streams, on Apache Beam.

Layers (ARCHITECTURE.md): ``beam_dp.core`` (guarantees, accounting, keyed noise, clipping, step
clock; no Beam), ``beam_dp.mechanisms`` (the families' pure state machines), ``beam_dp.steps`` (the
engine-neutral step driver), ``beam_dp.io`` (release schema, readers and sinks), ``beam_dp.beam`` and
``beam_dp.flink`` (the engine shells and public transforms), ``beam_dp.verify`` and ``beam_dp.report``.
"""

__version__ = "0.1.0"

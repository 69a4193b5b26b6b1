"""beam_dp: continual differentially private releases from unbounded streams, on Apache Beam.

Layers (see README): ``beam_dp.core`` (release record, guarantees and ledger, keyed noise,
clipping, step clock; no Beam), ``beam_dp.mechanisms`` (pure state machines), ``beam_dp.beam``
(the Beam adapter and public transforms) and ``beam_dp.io`` (release schema and sinks).
"""

__version__ = "0.1.0"

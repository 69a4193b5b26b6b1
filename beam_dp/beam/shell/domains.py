"""Noise domains: one per transform instance of a job, claimed when the transform is applied.

Every noise draw is keyed by (key, domain, calibration binding, stream, purpose, index): the binding
(``beam_dp.core.noise_binding``) is computed from the bound params where the noise is loaded.
A beam_dp transform binds its params' ``NoiseKey`` to its domain in ``expand``: the explicit
``NoiseKey(domain=...)`` if set, else the transform's full label in the pipeline (unique within a
pipeline and stable across replays of the same job). A domain claimed twice in one pipeline (two
transforms given the same explicit domain) is refused at construction: their noise would be
identical, and a difference of their releases would cancel it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from beam_dp.core.budget import composition_of
from beam_dp.core.group_privacy import RecordUnit
from beam_dp.io.schema import ReleaseLabels

__all__ = ["bind_noise_domain", "bound_domains", "pipeline_of", "release_labels"]

P = TypeVar("P")

_REGISTRY_ATTR = "_beam_dp_noise_domains"
_BOUND_ATTR = "_beam_dp_bound_params"


def bind_noise_domain(params: P, pvalue: Any) -> P:
    """``params`` with its noise key bound to the noise domain of the transform now being applied.

    Call from ``PTransform.expand`` with any input PValue (or a tuple/dict of them). Raises
    ``ValueError`` if the domain is already claimed in this pipeline.
    """
    pipeline = pipeline_of(pvalue)
    applied = pipeline._current_transform()  # the AppliedPTransform whose expand is running
    key = params.noise_key
    domain = key.domain or applied.full_label
    if not domain:
        raise ValueError("a beam_dp transform needs a label or an explicit NoiseKey(domain=...)")
    claimed = pipeline.__dict__.setdefault(_REGISTRY_ATTR, {})
    if domain in claimed:
        raise ValueError(
            f"noise domain {domain!r} is already used by transform {claimed[domain]!r} in this pipeline: two "
            "transforms under one noise key must never share noise; give each its own NoiseKey(domain=...)"
        )
    claimed[domain] = applied.full_label
    if key.domain != domain:
        params = dataclasses.replace(params, noise_key=dataclasses.replace(key, domain=domain))
    pipeline.__dict__.setdefault(_BOUND_ATTR, {})[domain] = (applied.full_label, params)
    return params


def bound_domains(pipeline: Any) -> dict[str, tuple[str, Any]]:
    """``{noise domain: (label of the transform that claimed it, its bound params)}`` of a pipeline
    (for its job manifest, ``beam_dp.beam.shell.manifest``)."""
    return dict(pipeline.__dict__.get(_BOUND_ATTR, {}))


def pipeline_of(pvalue: Any):
    """The pipeline of a PValue (or of the first of a tuple/dict of them)."""
    if isinstance(pvalue, dict):
        pvalue = next(iter(pvalue.values()))
    elif isinstance(pvalue, (tuple, list)):
        pvalue = pvalue[0]
    return pvalue.pipeline


def release_labels(params: Any, composition: str | None = None) -> ReleaseLabels:
    """The labels a transform stamps on its rows: its bound noise domain, how its spend composes (from
    its mechanism unless given) and its budget share."""
    if composition is None:
        composition = composition_of(params.build_mechanism())
    unit = getattr(params, "privacy_unit", None)
    unit_meta = tuple(unit.declaration().items()) if isinstance(unit, RecordUnit) else ()
    return ReleaseLabels(params.noise_key.domain, composition, params.budget, unit_meta)

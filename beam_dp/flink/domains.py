"""Noise domains of Flink release functions: one per release operator of a job, claimed when the job is built.

Every noise draw is keyed by (key, domain, calibration binding, stream, purpose, index): the binding
(``beam_dp.core.noise_binding``) is computed from the params where the noise is loaded. A release
function's domain is its params' explicit ``NoiseKey(domain=...)``, else the ``uid`` it is built with
(:func:`beam_dp.flink.job.release_stream`); there is no default, so two release functions cannot
fall back to one shared domain. The operator's Flink uid is ``beam_dp/<domain>``: the job graph
itself is the job's registry (read when a release function is added, on the client that builds
the job, never from process memory of a worker), a domain claimed twice in one job is refused with
``ValueError``, and Flink's own uid check refuses it again when the job graph is generated. The
operator's checkpointed state is tied to its domain: a savepoint restores into the operator of the
same domain only.

Across jobs: two jobs under one noise key that use the same domains share noise. Give each job
its own key, or each release function a domain no other job uses.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, TypeVar

__all__ = ["UID_PREFIX", "bind_noise_domain", "operator_uid"]

P = TypeVar("P")

UID_PREFIX = "beam_dp/"


def operator_uid(domain: str) -> str:
    """The Flink operator uid of the release function drawing in ``domain``."""
    return UID_PREFIX + domain


def bind_noise_domain(params: P, uid: str | None, claimed_uids: Iterable[str]) -> tuple[P, str]:
    """``(params with a bound noise domain, the operator uid)`` for a release function built with
    ``uid``, refusing a domain already claimed by an operator of the job (``claimed_uids``)."""
    key = params.noise_key
    if uid is not None and not (isinstance(uid, str) and uid):
        raise ValueError(f"uid must be a non-empty string, got {uid!r}")
    domain = key.domain or uid
    if domain is None:
        raise ValueError("a Flink release function needs a uid (release_stream(..., uid='sums'); it names its "
                         "noise domain) or an explicit NoiseKey(domain=...): there is no default domain")
    operator = operator_uid(domain)
    if operator in set(claimed_uids):
        raise ValueError(f"noise domain {domain!r} is already claimed by a release function of this job: two "
                         "release functions under one noise key must never share noise; give each its own uid "
                         "or NoiseKey(domain=...)")
    if key.domain != domain:
        params = dataclasses.replace(params, noise_key=dataclasses.replace(key, domain=domain))
    return params, operator

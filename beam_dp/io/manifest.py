"""The job manifest: a small JSON file ``_beam_dp_manifest.json`` written beside a job's releases.

It declares what the job is, independently of the release rows: its total ``(epsilon, delta)`` per
contribution and, per transform, its noise domain, mechanism, composition, budget share and the file
prefixes (relative to the manifest's folder) its releases are written to and, for a unit-level
transform, its privacy unit (user-level DP, ``docs/privacy_units.md``). ``python -m beam_dp.verify``
checks the rows against it (``beam_dp.verify.check_manifest``): a declared transform without
releases or files, a release of an undeclared domain, shares composing above the total, and rows
whose budget, composition, mechanism or job total differ from the declaration all fail verification.

Everything in it is public (parameters, names, paths); it holds no data-derived value.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from beam_dp.core.budget import COMPOSITIONS, compose

__all__ = ["MANIFEST_NAME", "MANIFEST_VERSION", "JobManifest", "ManifestTransform", "manifest_path", "read_manifest",
           "write_manifest"]

MANIFEST_NAME = "_beam_dp_manifest.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ManifestTransform:
    """One transform of a job: its noise domain, mechanism name, composition, its ``(epsilon, delta)``
    share of the job's total, the prefixes of the files holding its releases, and the calibration its
    noise is bound to (``calibration_binding(params)``; None in a manifest written before the binding)."""

    noise_domain: str
    mechanism: str
    composition: str
    epsilon: float
    delta: float
    files: tuple[str, ...]
    noise_binding: str | None = None
    #: the most the transform can spend of its share by the job's public last step
    #: (``beam_dp.core.budget.share_use``); None in a manifest written without it
    epsilon_spendable: float | None = None
    delta_spendable: float | None = None
    #: the privacy unit (its field's name) of a unit-level transform (``docs/privacy_units.md``); None:
    #: event level (then absent from the file)
    privacy_unit: str | None = None


@dataclass(frozen=True)
class JobManifest:
    """A job's declared total ``(epsilon, delta)`` per contribution and its transforms."""

    job: str
    epsilon: float
    delta: float
    transforms: tuple[ManifestTransform, ...]

    def problems(self) -> list[str]:
        """What is wrong with the declaration itself: a domain declared twice, an unknown composition,
        a pure share with a delta, shares composing above the total."""
        found: list[str] = []
        domains = [t.noise_domain for t in self.transforms]
        found += [f"the manifest declares noise domain {d!r} {domains.count(d)} times"
                  for d in sorted(set(domains)) if domains.count(d) > 1]
        found += [f"the manifest's transform {t.noise_domain!r} has composition {t.composition!r}, not one of "
                  f"{COMPOSITIONS}" for t in self.transforms if t.composition not in COMPOSITIONS]
        found += [f"the manifest's transform {t.noise_domain!r} is 'pure' but declares delta {t.delta:g}"
                  for t in self.transforms if t.composition == "pure" and t.delta > 0]
        if not found:
            total = compose(((t.composition, t.epsilon, t.delta) for t in self.transforms), self.delta)
            if total > self.epsilon * (1 + 1e-7):
                found.append(f"the manifest's shares compose to epsilon {total:.6g} at delta {self.delta:g}, more "
                             f"than its total {self.epsilon:g}")
        return found

    def to_json(self) -> str:
        data = asdict(self)
        for transform in data["transforms"]:  # an event-level transform's file is as without units
            if transform["privacy_unit"] is None:
                del transform["privacy_unit"]
        return json.dumps({"beam_dp_manifest": MANIFEST_VERSION, **data}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobManifest":
        """Parse a manifest; ``ValueError`` for anything that is not a version-1 manifest."""
        try:
            data = json.loads(text)
            if data.get("beam_dp_manifest") != MANIFEST_VERSION:
                raise ValueError(f"not a version {MANIFEST_VERSION} beam_dp manifest")
            transforms = tuple(ManifestTransform(
                str(t["noise_domain"]), str(t["mechanism"]), str(t["composition"]), _number(t["epsilon"]),
                _number(t["delta"]), tuple(str(f) for f in t["files"]), _text(t.get("noise_binding")),
                _spendable(t, "epsilon_spendable"), _spendable(t, "delta_spendable"), _text(t.get("privacy_unit")))
                for t in data["transforms"])
            return cls(str(data["job"]), _number(data["epsilon"]), _number(data["delta"]), transforms)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"malformed beam_dp manifest: {type(exc).__name__}: {exc}") from None


def _text(value) -> str | None:
    return None if value is None else str(value)


def _spendable(transform: dict, name: str) -> float | None:
    return None if transform.get(name) is None else _number(transform[name])


def _number(value) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"malformed beam_dp manifest: a budget of {value!r}")
    return number


def manifest_path(folder: str) -> str:
    """``<folder>/_beam_dp_manifest.json`` on the folder's filesystem."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.join(folder, MANIFEST_NAME)


def write_manifest(folder: str, manifest: JobManifest) -> str:
    """Write ``manifest`` to ``<folder>/_beam_dp_manifest.json`` (any Beam filesystem); returns the path."""
    from apache_beam.io.filesystems import FileSystems

    path = manifest_path(folder)
    with FileSystems.create(path) as fh:
        fh.write(manifest.to_json().encode("utf-8"))
    return path


def read_manifest(path: str) -> JobManifest:
    """The manifest at ``path`` (the file, or the folder holding it); ``FileNotFoundError`` if absent,
    ``ValueError`` if malformed."""
    from apache_beam.io.filesystems import FileSystems

    if not path.endswith(MANIFEST_NAME):
        path = manifest_path(path)
    if not FileSystems.exists(path):
        raise FileNotFoundError(f"no beam_dp manifest at {path}")
    with FileSystems.open(path) as fh:
        return JobManifest.from_json(fh.read().decode("utf-8"))

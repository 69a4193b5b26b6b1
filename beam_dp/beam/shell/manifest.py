"""A Beam job's manifest (``beam_dp.io.manifest``), collected from the pipeline it was built in.

Every beam_dp transform claims its noise domain in ``expand`` (``beam_dp.beam.shell.domains``); a job
records which release files each transform's releases go to with :func:`record_release_files`
(``pipelines.common.write_releases`` does). :func:`job_manifest` then lists, per claimed domain, the
mechanism, composition, budget share and file prefixes, and the job's total: the plan of the
transforms' shared ``JobBudget`` or, without one, the composition of the transforms' guarantees.

A pipeline whose release writes are not recorded (a Beam YAML pipeline: its writes are ordinary file
sinks) gets its manifest from the built graph with :func:`write_pipeline_manifest`: every file sink
downstream of a release PCollection is that transform's release files.
"""

from __future__ import annotations

import posixpath
from typing import Any, Callable

from beam_dp.beam.shell.domains import bound_domains
from beam_dp.core.budget import COMPOSITIONS, compose, composition_of, share_use
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.io.manifest import JobManifest, ManifestTransform, write_manifest

__all__ = ["job_manifest", "params_composition", "record_release_files", "release_file_writes", "release_folder",
           "write_pipeline_manifest"]

_FILES_ATTR = "_beam_dp_release_files"


def record_release_files(releases: Any, prefix: str) -> None:
    """Note that the releases in PCollection ``releases`` are written to files ``<prefix>-*`` (a name
    relative to the job's output folder, where the manifest goes)."""
    pipeline = releases.pipeline
    pipeline.__dict__.setdefault(_FILES_ATTR, []).append((releases.producer.full_label, prefix))


def _top(label: str) -> str:
    return label.split("/", 1)[0]


def params_composition(params: Any, mechanism: Any) -> str:
    """How a transform's releases compose: its params' declared ``composition`` (e.g. lifelong's
    ``"approx"``) if it has one, else its mechanism's (``composition_of``)."""
    declared = getattr(params, "composition", None)
    return declared if declared in COMPOSITIONS else composition_of(mechanism)


def job_manifest(pipeline: Any, job: str) -> JobManifest:
    """The manifest of the beam_dp transforms applied in ``pipeline`` (see the module docstring). A
    transform's files are the recorded prefixes whose releases come from under its top-level label."""
    files = pipeline.__dict__.get(_FILES_ATTR, [])
    transforms, shares, plans, budgeted = [], [], set(), 0
    for domain, (label, params) in sorted(bound_domains(pipeline).items()):
        mechanism = params.build_mechanism()
        budget = getattr(params, "budget", None)
        if budget is not None:
            plans.add((float(budget.plan.epsilon), float(budget.plan.delta)))
            budgeted += 1
            epsilon, delta = float(budget.epsilon), float(budget.delta)
        else:
            epsilon, delta = float(mechanism.guarantee.epsilon), float(mechanism.guarantee.delta)
        composition = params_composition(params, mechanism)
        prefixes = tuple(sorted({prefix for producer, prefix in files if _top(producer) == _top(label)}))
        use = share_use(domain, params, mechanism)
        unit = getattr(params, "privacy_unit", None)
        transforms.append(ManifestTransform(domain, mechanism.name, composition, epsilon, delta, prefixes,
                                            calibration_binding(params), use.spendable_epsilon, use.spendable_delta,
                                            None if unit is None else unit.column))
        shares.append((composition, epsilon, delta))
    if len(plans) == 1 and budgeted == len(shares):
        total_epsilon, total_delta = plans.pop()
    else:  # no job budget (or several): the job is the composition of its transforms' own guarantees
        total_delta = sum(d for _, _, d in shares)
        total_epsilon = compose(shares, total_delta) if shares else 0.0
    return JobManifest(job, total_epsilon, total_delta, tuple(transforms))


_FIRST_SHARD = "-00000-of-00001"


def _file_prefix(transform: Any) -> str | None:
    """The path prefix of the files a file sink writes (``<prefix>-<shard>-of-<shards>...``): a Beam
    ``Write`` of a file-based sink, or ``fileio.WriteToFiles`` (Beam YAML's JSON/CSV writers) with a
    sharded file naming; None for any other transform. ``ValueError`` for ``WriteToFiles`` with another
    naming: its releases could not be found by prefix."""
    from apache_beam.io.fileio import WriteToFiles
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.io.iobase import Write
    from apache_beam.transforms.window import GlobalWindow

    def value(v: Any) -> str:
        return str(v.get() if hasattr(v, "get") else v)

    if isinstance(transform, Write):
        prefix = getattr(transform.sink, "file_path_prefix", None)
        return None if prefix is None else value(prefix)
    if isinstance(transform, WriteToFiles):
        name = transform.file_naming_fn(GlobalWindow(), None, 0, 1, "", None)
        if _FIRST_SHARD not in name:
            raise ValueError(f"release files named like {name!r} under {value(transform.path)}: write releases to "
                             "sharded files (<prefix>-00000-of-00001...), which the job's manifest can name")
        return FileSystems.join(value(transform.path), name.split(_FIRST_SHARD)[0])
    return None


def release_file_writes(pipeline: Any, is_release: Callable[[Any], bool]) -> list[tuple[Any, str]]:
    """``(release PCollection, file path prefix)`` of every file sink (see :func:`_file_prefix`) in ``pipeline`` that has a PCollection for which ``is_release`` is true among
    its ancestors (the nearest one on each path); dead-letter writes, which descend from no release
    PCollection, are not listed."""
    from apache_beam.pipeline import PipelineVisitor

    writes: list[tuple[Any, str]] = []

    def releases_above(pcoll: Any) -> list:
        found, todo, seen = [], [pcoll], set()
        while todo:
            current = todo.pop()
            if id(current) in seen or getattr(current, "producer", None) is None:
                continue
            seen.add(id(current))
            if is_release(current):
                found.append(current)
            else:
                todo += list(current.producer.inputs)
        return found

    class _Sinks(PipelineVisitor):
        def enter_composite_transform(self, node) -> None:
            prefix = _file_prefix(node.transform)
            if prefix is not None:
                writes.extend((pcoll, prefix) for i in node.inputs for pcoll in releases_above(i))

    pipeline.visit(_Sinks())
    return writes


def write_pipeline_manifest(pipeline: Any, job: str, is_release: Callable[[Any], bool]) -> str | None:
    """Write the manifest of a built ``pipeline`` whose release writes were not recorded (see
    :func:`release_file_writes`) beside its release files; returns its path. None when it writes no
    release to files (e.g. to Pub/Sub only). ``ValueError`` when the releases go to several folders:
    one manifest declares one folder's files."""
    folder = release_folder(pipeline, is_release)
    if folder is None:
        return None
    for pcoll, prefix in release_file_writes(pipeline, is_release):
        record_release_files(pcoll, posixpath.basename(prefix))
    return write_manifest(folder, job_manifest(pipeline, job))


def release_folder(pipeline: Any, is_release: Callable[[Any], bool]) -> str | None:
    """The one folder a built ``pipeline`` writes its release files to (see :func:`release_file_writes`);
    None when it writes none to files. ``ValueError`` when they go to several folders: one manifest
    declares one folder's files."""
    folders = sorted({posixpath.dirname(prefix) for _, prefix in release_file_writes(pipeline, is_release)})
    if len(folders) > 1:
        raise ValueError(f"releases written to several folders {folders}: write them to one folder, where the "
                         "job's manifest goes (python -m beam_dp.verify reads it)")
    return folders[0] if folders else None

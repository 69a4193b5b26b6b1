"""Where a job writes, and how a run's outputs become visible: checked locations, a lock, a staging
folder published only at success.

Two locations per job:

* ``--output``: the private releases only (plus the job's manifest and public summary files):
  whoever may read the releases may read this folder.
* ``--dead-letter-output`` (default: the sibling ``<output>.private``): **raw data**: the dead letters
  (rejected elements as read, with their values) and a demo run's input. Keep it as private as the input.

A local batch run (the launcher waits for it) writes both into staging folders beside them
(``<location>.staging-<run id>``) and publishes them when the pipeline succeeded: the previous
folder is renamed aside, the staging folder renamed into place, and only then is the previous one
deleted. A failure, Ctrl-C, SIGTERM or SIGHUP before that leaves the previous output byte for byte
as it was (the staging folder is removed). A run holds ``<location>.lock`` (created exclusively; a
lock left by a dead process on this host is taken over) so a second run into the same folder is
refused instead of mixing; holding it, a run removes the staging folders a killed run left beside
the location, and says so. On an object store (``gs://``, ``s3://``) renames are per file and the lock file is not
atomic: publish is still "complete output first, then swap", but two launches at once are not
excluded there: give each run its own ``--output``.

A job that the launcher does not wait for (a streaming job, a remote runner) writes in place; it
is refused when its folders already hold files, so two runs never mix.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from beam_dp.io.locations import overlap_error
from pipelines.paths import FileSystems, display, is_local, join, write_text

__all__ = ["BEAM_DP_FILES", "PRIVATE_README", "OutputError", "RunOutputs", "check_location", "normal_location",
           "private_default", "private_dir"]

#: Names an earlier beam_dp run leaves in its folders: only a folder holding nothing else is replaced.
BEAM_DP_FILES = ("*-of-*", "*-????????????????????????????????.parquet", "*-????????????????????????????????.jsonl",
                 "dead_letter-*", "demo_*", "beam-temp-*", "_beam_dp_*", "README_RAW_DATA.txt")
PRIVATE_README = "README_RAW_DATA.txt"
_README_TEXT = ("This folder holds RAW DATA written by a beam_dp job: its dead letters (rejected input elements, "
                "with their values) and, for a demo run, the demo input. It is not differentially private: keep "
                "it as private as the job's input. The private releases are in the job's --output folder.\n")


#: the client library a filesystem registered by Beam needs only when used
_CLIENTS = {"s3": "boto3", "azfs": "azure.storage.blob"}


class OutputError(Exception):
    """An output location the job cannot use (one line for the user)."""


def private_default(output: str) -> str:
    """The default raw-data location of ``output``: its sibling ``<output>.private``."""
    return output.rstrip("/") + ".private"


def private_dir(opts) -> str:
    """A job's raw-data folder: ``--dead-letter-output``, else the sibling of ``--output``."""
    return opts.dead_letter_output or private_default(opts.output)


def check_location(path: str, flag: str) -> None:
    """Refuse an output location whose filesystem is not installed or cannot be listed, that is a
    file, or (local) that cannot be created or written."""
    scheme = path.split("://", 1)[0] if "://" in path else "file"
    extra = {"gs": "gcp", "s3": "aws", "azfs": "azure", "hdfs": "hadoop"}.get(scheme)
    hint = f": pip install 'apache-beam[{extra}]'" if extra else " (no Beam filesystem handles it)"
    try:
        FileSystems().get_filesystem(path)
        if scheme in _CLIENTS:
            importlib.import_module(_CLIENTS[scheme])
        if not is_local(path):
            _entries(path)  # e.g. s3:// is registered without boto3 and fails only when used
    except Exception as exc:
        text = f"{exc!r} {exc.__cause__!r}"
        if isinstance(exc, ValueError) or "install" in text or "ImportError" in text or "No module" in text:
            raise OutputError(f"{flag} {path}: the {scheme}:// filesystem is not installed{hint}") from None
        raise OutputError(f"{flag} {path}: cannot list it ({type(exc).__name__}): check the path and credentials") \
            from None
    if not is_local(path):
        return
    local = display(path)
    if os.path.exists(local) and not os.path.isdir(local):
        raise OutputError(f"{flag} {local} is a file: give a folder")
    parent = local
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputError(f"{flag} {local}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {local}: {parent} is not writable")
    if os.path.isdir(local) and not os.access(os.path.dirname(local) or ".", os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {local}: its parent folder is not writable (a run replaces the folder)")


def _entries(path: str) -> list[str]:
    """Names directly under a folder (local) or a prefix (object store); empty when it does not exist."""
    if is_local(path):
        local = display(path)
        return sorted(os.listdir(local)) if os.path.isdir(local) else []
    from pipelines.paths import match

    prefix = path.rstrip("/") + "/"
    return sorted({p[len(prefix):].split("/")[0] for p in match(prefix + "**") if p.startswith(prefix)})


def _foreign(path: str) -> list[str]:
    return [n for n in _entries(path) if not any(fnmatch.fnmatch(n, pattern) for pattern in BEAM_DP_FILES)]


@dataclass
class _Target:
    flag: str
    final: str
    staging: str = ""
    lock: str | None = None
    created: bool = False  # this run made the folder it writes in place (removed again if left empty)


@dataclass
class RunOutputs:
    """The locations of one run. ``staged`` runs (local batch) write to :attr:`output`/:attr:`private`
    (the staging folders) and :meth:`publish` at success; others write in place.

    Use as a context manager: entering checks the locations and takes the locks; leaving without a
    publish removes the staging folders and leaves the previous output untouched."""

    output: str
    private: str
    staged: bool = True
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8])
    flags: tuple[str, str] = ("--output", "--dead-letter-output")  # how the user names the two (in messages)
    _targets: list[_Target] = field(default_factory=list)
    published: bool = False

    def __post_init__(self) -> None:
        self._targets = [_Target(self.flags[0], normal_location(self.output)),
                         _Target(self.flags[1], normal_location(self.private))]
        if self._targets[0].final == self._targets[1].final:
            raise OutputError(f"{self.flags[1]} must differ from {self.flags[0]}: dead letters are raw data")
        nested = overlap_error([(t.flag, t.final) for t in self._targets])  # nothing is written before
        if nested:
            raise OutputError(nested)

    # -- entering --------------------------------------------------------------------------------
    def __enter__(self) -> "RunOutputs":
        for t in self._targets:
            check_location(t.final, t.flag)
        try:
            for t in self._targets:
                try:
                    t.lock = self._take_lock(t)
                except OSError as exc:  # e.g. a parent the checks could not see through (/proc)
                    raise OutputError(f"{t.flag} {display(t.final)}: cannot write beside it "
                                      f"({exc.strerror or type(exc).__name__})") from None
                foreign = _foreign(t.final)
                if foreign:
                    raise OutputError(f"{t.flag} {display(t.final)} holds files beam_dp did not write ({foreign[0]!r}"
                                      f"{', ...' if len(foreign) > 1 else ''}): give an empty or new folder")
                if not self.staged and _entries(t.final):
                    raise OutputError(f"{t.flag} {display(t.final)} is not empty: a job that is not waited for "
                                      "writes in place, so give each such run a new folder")
                t.staging = f"{t.final}.staging-{self.run_id}" if self.staged else t.final
                t.created = not self.staged and is_local(t.final) and not os.path.exists(display(t.final))
                try:
                    _make_folder(t.staging)
                except OSError as exc:
                    raise OutputError(f"{t.flag} {display(t.final)}: cannot create {display(t.staging)} "
                                      f"({exc.strerror or type(exc).__name__})") from None
            write_text(join(self._targets[1].staging, PRIVATE_README), _README_TEXT)
        except BaseException:
            self._clean()
            raise
        _remove_dead_staging(self._targets)
        self.output, self.private = self._targets[0].staging, self._targets[1].staging
        return self

    def _take_lock(self, t: _Target) -> str | None:
        """Create ``<final>.lock`` exclusively (local disks); refuse when a live run holds it."""
        if not is_local(t.final):
            return None
        path = display(t.final) + ".lock"
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _lock_holder(path)
                if holder is not None:
                    raise OutputError(f"{t.flag} {display(t.final)} is held by a running job ({holder}; lock "
                                      f"{path}): wait for it, or use another folder") from None
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)  # its process is gone
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump({"pid": os.getpid(), "host": socket.gethostname(), "run": self.run_id}, fh)
            return path
        raise OutputError(f"cannot take the lock {path}: another job is starting; try again")

    # -- leaving ---------------------------------------------------------------------------------
    def publish(self, releases: bool = True) -> None:
        """Swap each staging folder into place (SIGINT, SIGTERM and SIGHUP ignored for the few renames).
        ``releases=False``: only the raw-data folder (the run's dead letters); the previous ``--output``
        stays as it was and this run's releases are removed with its staging folder."""
        if not self.staged:
            self.published = True
            return
        held = threading.current_thread() is threading.main_thread()  # signals: main thread only
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _HELD_OFF} if held else {}
        try:
            for t in self._targets if releases else self._targets[1:]:
                _swap(t.staging, t.final, f"{t.final}.previous-{self.run_id}")
                t.staging = ""
            self.published = releases
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def kept(self) -> str:
        """One line: what a failed or interrupted run left as it was."""
        out = self._targets[0].final
        if not self.staged and not self.published:
            if _entries(out):
                return f"files written so far are under {display(out)}"
            return f"nothing was written under {display(out)}"
        if _entries(out):
            return f"the previous output under {display(out)} is kept unchanged"
        return f"nothing was published under {display(out)}"

    def __exit__(self, *exc) -> None:
        self._clean()

    def _clean(self) -> None:
        for t in self._targets:
            if self.staged and t.staging and not self.published:
                _remove(t.staging)
            elif t.created and not self.published and set(_entries(t.final)) <= {PRIVATE_README}:
                _remove(t.final)  # a run in place that wrote nothing: no empty folder left behind
            if t.lock:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(t.lock)
                t.lock = None

    @property
    def final_output(self) -> str:
        return self._targets[0].final

    @property
    def final_private(self) -> str:
        return self._targets[1].final


#: signals that would end the process between the renames of a publish
_HELD_OFF = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _remove_dead_staging(targets: list[_Target]) -> None:
    """Remove ``<final>.staging-*`` folders beside locked local targets, and say so in one line: a run
    writes there only while it holds ``<final>.lock``, which this run now holds, so they were left by
    runs that were killed (SIGKILL, a power cut) and hold partial releases and raw dead letters."""
    dead = []
    for t in targets:
        if not t.lock:
            continue
        final = display(t.final)
        parent, name = os.path.dirname(final) or ".", os.path.basename(final)
        pattern = re.compile(re.escape(name) + r"\.staging-\d{8}T\d{6}-[0-9a-f]{8}")  # RunOutputs.run_id
        with contextlib.suppress(OSError):
            dead += [os.path.join(parent, n) for n in sorted(os.listdir(parent))
                     if pattern.fullmatch(n) and os.path.join(parent, n) != display(t.staging)]
    if not dead:
        return
    size = sum(os.path.getsize(os.path.join(d, f)) for path in dead for d, _, files in os.walk(path) for f in files
               if not os.path.islink(os.path.join(d, f)))
    for path in dead:
        shutil.rmtree(path, ignore_errors=True)
    logging.getLogger("beam_dp.pipelines").warning(
        "beam_dp: removed %d staging folder%s left by runs that were killed (%s; %.1f MB of partial output and "
        "raw dead letters)", len(dead), "" if len(dead) == 1 else "s", ", ".join(dead), size / 1e6)


def normal_location(path: str) -> str:
    """A location as compared and staged: a local path made absolute (``.`` or ``out/`` name a folder
    with siblings); others without a trailing /."""
    return display(path) if is_local(path) else (path.rstrip("/") or path)


def _lock_holder(path: str) -> str | None:
    """``pid N on host`` of a live holder of the lock; None when its process is gone (same host)."""
    try:
        with open(path) as fh:
            info = json.load(fh)
        pid, host = int(info["pid"]), str(info["host"])
    except (OSError, ValueError, KeyError, TypeError):
        if time.time() - _mtime(path) < 10:
            return "a job that is starting"
        return None  # an unreadable lock older than a launch: a crash while writing it
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    return f"pid {pid} on {host}"


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _make_folder(path: str) -> None:
    if is_local(path):
        os.makedirs(display(path), exist_ok=True)


def _files(prefix: str) -> list[str]:
    from pipelines.paths import match

    return match(prefix.rstrip("/") + "/**")


def _remove(path: str) -> None:
    if is_local(path):
        shutil.rmtree(display(path), ignore_errors=True)
        return
    files = _files(path)
    if files:
        FileSystems().delete(files)


def _swap(staging: str, final: str, previous: str) -> None:
    """``final`` <- ``staging``; the old ``final`` is moved to ``previous`` first and deleted last."""
    if is_local(final):
        staging, final, previous = display(staging), display(final), display(previous)
        moved = os.path.lexists(final)
        if moved:
            os.rename(final, previous)
        os.rename(staging, final)
        if moved:
            shutil.rmtree(previous, ignore_errors=True)
        return
    fs = FileSystems()
    old = _files(final)
    if old:
        fs.rename(old, [previous + p[len(final):] for p in old])
    new = _files(staging)
    fs.rename(new, [final + p[len(staging):] for p in new])
    if old:
        fs.delete([previous + p[len(final):] for p in old])

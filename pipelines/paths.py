"""User paths, on any Beam filesystem (local, ``gs://``, ``s3://``, ...): every job reads and writes
through these helpers (Beam's ``FileSystems``), never through ``pathlib`` or ``open``, so an output
folder on GCS gets every file and the launcher's local disk none."""

from __future__ import annotations

import os

__all__ = ["FileSystems", "display", "is_local", "join", "match", "read_bytes", "read_text_lines",
           "write_text"]


def FileSystems():  # noqa: N802 - Beam's class, imported on first use (a job's --help never loads Beam)
    from apache_beam.io.filesystems import FileSystems as fs

    return fs


def is_local(path: str) -> bool:
    """True for a path of the local filesystem (no scheme)."""
    return FileSystems().get_scheme(path) in (None, "file")


def join(folder: str, *names: str) -> str:
    """``folder/name`` on the folder's filesystem."""
    return FileSystems().join(folder, *names)


def display(path: str) -> str:
    """The path as a user should read it: absolute when local, unchanged otherwise."""
    return os.path.abspath(path) if is_local(path) else path


def match(pattern: str) -> list[str]:
    """Sorted paths matching ``pattern`` (a glob); empty when none."""
    return sorted(m.path for m in FileSystems().match([pattern])[0].metadata_list)


def write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, creating the local parent folder if needed."""
    if is_local(path):
        os.makedirs(os.path.dirname(display(path)), exist_ok=True)
    with FileSystems().create(path) as fh:
        fh.write(text.encode("utf-8"))


def read_bytes(path: str) -> bytes:
    """The whole content of one file."""
    with FileSystems().open(path) as fh:
        return fh.read()


def read_text_lines(pattern: str) -> list[str]:
    """The non-empty lines of every file matching ``pattern``, in path order."""
    return [line for path in match(pattern) for line in read_bytes(path).decode("utf-8").splitlines() if line.strip()]

"""``memfs://``: a Beam FileSystem kept in this process's memory, to check that a job reaches every
file through ``FileSystems`` (as it must for ``gs://``): a path handled by ``pathlib`` or ``open``
would land on the local disk instead. Object-store semantics like GCS: no directories, a "folder"
is a name prefix. Importing this module registers the scheme (Beam finds FileSystem subclasses).
"""

from __future__ import annotations

import io
import posixpath
import threading

from apache_beam.io.filesystem import BeamIOError, FileMetadata, FileSystem

__all__ = ["MemFileSystem"]


class _Upload(io.BytesIO):
    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def close(self) -> None:
        if not self.closed:
            with MemFileSystem.lock:
                MemFileSystem.files[self._path] = self.getvalue()
        super().close()


class MemFileSystem(FileSystem):
    """Every instance shares :attr:`files` (Beam builds a new instance per call)."""

    files: dict[str, bytes] = {}
    lock = threading.Lock()

    @classmethod
    def scheme(cls) -> str:
        return "memfs"

    @classmethod
    def clear(cls) -> None:
        with cls.lock:
            cls.files.clear()

    def join(self, basepath: str, *paths: str) -> str:
        return posixpath.join(basepath.rstrip("/"), *paths)

    def split(self, path: str) -> tuple[str, str]:
        head, tail = posixpath.split(path)
        return head, tail

    def mkdirs(self, path: str) -> None:
        pass  # object store: folders exist implicitly

    def has_dirs(self) -> bool:
        return False

    def _list(self, dir_or_prefix: str):
        with self.lock:
            items = [(p, len(b)) for p, b in self.files.items() if p.startswith(dir_or_prefix)]
        for path, size in items:
            yield FileMetadata(path, size, 0.0)

    def create(self, path, mime_type="application/octet-stream", compression_type=None):
        return _Upload(path)

    def open(self, path, mime_type="application/octet-stream", compression_type=None):
        with self.lock:
            if path not in self.files:
                raise BeamIOError("open failed", {path: FileNotFoundError(path)})
            return io.BytesIO(self.files[path])

    def copy(self, source_file_names, destination_file_names) -> None:
        with self.lock:
            for src, dst in zip(source_file_names, destination_file_names):
                self.files[dst] = self.files[src]

    def rename(self, source_file_names, destination_file_names) -> None:
        with self.lock:
            for src, dst in zip(source_file_names, destination_file_names):
                self.files[dst] = self.files.pop(src)

    def exists(self, path: str) -> bool:
        with self.lock:
            return path in self.files or any(p.startswith(path.rstrip("/") + "/") for p in self.files)

    def size(self, path: str) -> int:
        return len(self.files[path])

    def last_updated(self, path: str) -> float:
        return 0.0

    def checksum(self, path: str) -> str:
        return str(hash(self.files[path]))

    def metadata(self, path: str) -> FileMetadata:
        return FileMetadata(path, self.size(path), 0.0)

    def delete(self, paths) -> None:
        with self.lock:
            for path in paths:
                prefix = path.rstrip("/") + "/"
                for name in [p for p in self.files if p == path or p.startswith(prefix)]:
                    del self.files[name]

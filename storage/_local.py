"""The local-directory object store: one file per key under a root directory.

Used for single-machine deployments and tests. Writes go to `<root>/.tmp/` and are renamed into
place only after an fsync, so a reader (or a crash) never sees a half-written object; readers
that want zero-copy access (memory-mapped token arrays) get the real path from `local_path`.
"""

from __future__ import annotations

import errno
import os
import uuid
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

from storage._keys import TMP_SEGMENT, ObjectNotFound, check_key, check_prefix, check_range


class _FileWriter:
    def __init__(self, fh: BinaryIO):
        self._fh = fh
        self.bytes_written = 0

    def write(self, b: bytes) -> None:
        self._fh.write(b)
        self.bytes_written += len(b)


class LocalObjectStore:
    def __init__(self, root: Path, url: str):
        if not root.is_absolute():
            raise ValueError("the local storage root must be an absolute path, as in file:///srv/openft/objects")
        self.root = root
        self.url = url
        self._tmp = root / TMP_SEGMENT
        self._tmp.mkdir(parents=True, exist_ok=True)

    def spec(self) -> tuple[str, str | None, str]:
        return (self.url, None, "us-east-1")

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _file(self, key: str) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(key)
        return path

    @contextmanager
    def writer(self, key: str) -> Iterator[_FileWriter]:
        target = self._path(key)
        tmp = self._tmp / f"{uuid.uuid4().hex}.part"
        try:
            with open(tmp, "wb") as fh:
                w = _FileWriter(fh)
                yield w
                fh.flush()
                os.fsync(fh.fileno())
            self._publish(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _publish(self, tmp: Path, target: Path) -> None:
        # delete_prefix prunes empty directories; one may vanish between makedirs and replace.
        for _ in range(3):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(tmp, target)
                break
            except FileNotFoundError:
                if not tmp.exists():
                    raise
        else:
            raise OSError(errno.ENOENT, "object directory kept disappearing during the write", str(target.parent))
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself must survive a power loss, not just the data
        finally:
            os.close(dir_fd)

    def put_bytes(self, key: str, data: bytes) -> None:
        with self.writer(key) as w:
            w.write(data)

    def get_bytes(self, key: str) -> bytes:
        return self._file(key).read_bytes()

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        fh = open(self._file(key), "rb")

        def chunks() -> Iterator[bytes]:
            with fh:
                while block := fh.read(chunk_size):
                    yield block

        return chunks()

    def read_range(self, key: str, start: int, end: int) -> bytes:
        check_range(start, end)
        with open(self._file(key), "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    def size(self, key: str) -> int:
        return self._file(key).stat().st_size

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_file():
            path.unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        if not check_prefix(prefix):
            raise ValueError("delete_prefix needs a non-empty prefix; deleting the whole store is not offered")
        keys = list(self.list(prefix))
        for key in keys:
            (self.root / key).unlink(missing_ok=True)
        self._prune_empty_dirs(keys, prefix)
        return len(keys)

    def _prune_empty_dirs(self, keys: list[str], prefix: str) -> None:
        """Remove directories the deleted keys leave empty, but only those inside the prefix."""
        dirs = {parent for key in keys for parent in PurePosixPath(key).parents if parent.name}
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            if not f"{d}/".startswith(prefix):
                continue
            try:
                os.rmdir(self.root / d)
            except OSError as exc:
                # Not empty (other keys, or a concurrent writer just published there): keep it.
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise

    def list(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
        # Walk only the deepest directory the prefix names fully, then filter by the string prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / base if base else self.root
        keys: list[str] = []
        for dirpath, dirs, files in os.walk(top):
            if Path(dirpath) == self.root:
                dirs[:] = [d for d in dirs if d != TMP_SEGMENT]
            rel = os.path.relpath(dirpath, self.root)
            for name in files:
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return iter(sorted(keys))

    def presigned_get_url(self, key: str, expires_s: int, headers: dict[str, str] | None = None) -> None:
        check_key(key)
        return None

    def presigned_put_url(self, key: str, expires_s: int) -> None:
        check_key(key)
        return None

    def local_path(self, key: str) -> Path:
        return self._file(key)

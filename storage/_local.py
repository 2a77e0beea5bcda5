"""The local-directory object store: one file per key under a root directory.

Used for single-machine deployments and tests. Writes go to `<root>/.tmp/` and are renamed into
place only after an fsync, so a reader (or a crash) never sees a half-written object; readers
that want zero-copy access (memory-mapped token arrays) get the real path from `local_path`.

Large objects bypass the page cache: writes are staged in a page-aligned buffer and, once an
object outgrows it, written with O_DIRECT, and `iter_into` reads with O_DIRECT too. Buffered
writes of fresh multi-GB files ran at ~0.4 GB/s on the 2-core test machine (every page-cache page
allocated, dirtied, then flushed by the fsync), direct ones at ~2.3 GB/s (`bench/merge.py`); and a
merge's read-back then checks what the device holds, not the cache. File systems without O_DIRECT
(tmpfs, some network mounts), and systems without it (macOS), get plain buffered I/O.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

from storage._keys import TMP_SEGMENT, ObjectNotFound, check_key, check_prefix, check_range

STAGE_BYTES = 16 << 20  # a multiple of every device's logical block size


def aligned_buffer(size: int = STAGE_BYTES) -> memoryview:
    """A page-aligned buffer, as O_DIRECT needs; its pages are allocated on first touch."""
    return memoryview(mmap.mmap(-1, size))


class _FileWriter:
    """Stages writes in an aligned buffer. An object that fills it switches its file to O_DIRECT
    (file offsets are then multiples of STAGE_BYTES, so every direct write is aligned) and from
    then on each full block is written by a background thread while the caller fills a second
    one, so the device write overlaps the caller's work; the tail that does not fill a block is
    written buffered at close. Small objects never go direct and start no thread."""

    def __init__(self, fd: int):
        self._fd = fd
        self._stage: memoryview | None = None
        self._spare: memoryview | None = None
        self._fill = 0
        self._offset = 0  # where the current stage goes in the file
        self._direct: bool | None = None  # None: not tried yet
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self.bytes_written = 0

    def write(self, b: bytes) -> None:
        view = memoryview(b).cast("B")
        self.bytes_written += len(view)
        if self._stage is None:
            self._stage = aligned_buffer()
        while view:
            n = min(len(view), STAGE_BYTES - self._fill)
            self._stage[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == STAGE_BYTES:
                self._ship()

    def _ship(self) -> None:
        if self._pool is None:
            self._direct = _set_direct(self._fd, True)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="object-write")
            self._spare = aligned_buffer()
        self._wait()
        self._pending = self._pool.submit(self._write_at, self._stage, self._offset)
        self._offset += STAGE_BYTES
        self._stage, self._spare = self._spare, self._stage
        self._fill = 0

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Write what is staged; the caller fsyncs."""
        try:
            self._wait()
            if self._direct:
                self._direct = _set_direct(self._fd, False)
            if self._fill:
                self._write_at(self._stage[: self._fill], self._offset)
        finally:
            self.discard()

    def discard(self) -> None:
        """Let a background write end before the file is closed and removed."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._pending = self._stage = self._spare = None

    def _write_at(self, view: memoryview, offset: int) -> None:
        while view:
            try:
                n = os.pwrite(self._fd, view, offset)
            except OSError as exc:
                if not (self._direct and exc.errno == errno.EINVAL):
                    raise
                # The device refused this direct write's alignment: carry on buffered.
                self._direct = _set_direct(self._fd, False)
                continue
            view, offset = view[n:], offset + n
            if view and self._direct:
                self._direct = _set_direct(self._fd, False)  # a short direct write: the rest is unaligned


class _FileReader:
    """Reads a file into two halves of the caller's buffer, the next half in a background thread
    while the caller works on the current one; O_DIRECT where the file system and the buffer's
    alignment allow."""

    def __init__(self, fd: int, buf: memoryview):
        if not len(buf):
            raise ValueError("iter_into needs a non-empty buffer")
        half = len(buf) // 2 // mmap.PAGESIZE * mmap.PAGESIZE
        self._fd = fd
        self._halves = [buf[:half], buf[half : 2 * half]] if half else [buf]
        self._direct = _set_direct(fd, True)

    def __iter__(self) -> Iterator[memoryview]:
        halves, offset, i = self._halves, 0, 0
        with ThreadPoolExecutor(1, thread_name_prefix="object-read") as pool:
            ahead = pool.submit(self._read_at, halves[0], 0)
            while n := ahead.result():
                offset += n
                more = n == len(halves[i])
                if len(halves) == 2:
                    current, i = halves[i][:n], 1 - i
                    ahead = pool.submit(self._read_at, halves[i], offset) if more else _done(0)
                    yield current
                else:  # a buffer too small to halve: no read-ahead
                    yield halves[0][:n]
                    ahead = _done(self._read_at(halves[0], offset) if more else 0)

    def _read_at(self, view: memoryview, offset: int) -> int:
        try:
            return pread_full(self._fd, view, offset)
        except OSError as exc:
            if not (self._direct and exc.errno == errno.EINVAL):
                raise
            self._direct = _set_direct(self._fd, False)  # the buffer is not aligned for this device
            return pread_full(self._fd, view, offset)  # positional reads: starting over is safe


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux; macOS has none


def pread_full(fd: int, view: memoryview, offset: int) -> int:
    """Fill `view` from file offset `offset`; returns the bytes read, fewer only at the end of the file."""
    got = 0
    while got < len(view):
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[got:]], offset + got)
        else:
            data = os.pread(fd, len(view) - got, offset + got)
            n = len(data)
            view[got : got + n] = data
        if n == 0:
            break
        got += n
    return got


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for `fd`; returns whether it is on."""
    if not _O_DIRECT:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT if on else flags & ~_O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    return on


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
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            w = _FileWriter(fd)
            try:
                yield w
                w.close()
                os.fsync(fd)
            finally:
                w.discard()
                os.close(fd)
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

    def iter_into(self, key: str, buf: memoryview) -> Iterator[memoryview]:
        fd = os.open(self._file(key), os.O_RDONLY | os.O_CLOEXEC)

        def chunks() -> Iterator[memoryview]:
            try:
                yield from _FileReader(fd, buf)
            finally:
                os.close(fd)

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

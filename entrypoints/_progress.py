"""What the user CLI draws while it waits: a byte progress bar around a file being uploaded, and
one live status line rewritten in place (carriage return) while a job or a merge runs."""

from __future__ import annotations

import io
import os
import shutil
import sys
from typing import IO, TextIO

from tqdm import tqdm


def byte_bar(total: int, desc: str, initial: int = 0) -> tqdm:
    """Bytes sent or received, on stderr, so that stdout stays the command's answer."""
    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, dynamic_ncols=True, leave=True)  # fmt: skip


class ReadProgress(io.RawIOBase):
    """A binary file whose reads move `bar` to the position read so far: httpx reads an upload's body
    from it chunk by chunk as it sends it (and seeks back to 0 to start, or to send it again)."""

    def __init__(self, fh: IO[bytes], bar: tqdm):
        self._fh = fh
        self._bar = bar

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:  # httpx sizes the multipart body from the file's stat
        return self._fh.fileno()

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self._fh.seek(offset, whence)
        self._move()
        return position

    def read(self, size: int = -1) -> bytes:
        chunk = self._fh.read(size)
        self._move()
        return chunk

    def readinto(self, buffer) -> int:
        n = self._fh.readinto(buffer)
        self._move()
        return n

    def _move(self) -> None:
        if self._bar.disable is True:  # closed: the body was sent, httpx reads past its end
            return
        self._bar.update(self._fh.tell() - self._bar.n)
        if self._bar.n >= (self._bar.total or 0):
            # Sent: closed now, so that its time and rate are the sending's, not the validation's
            # that the server runs before it answers.
            self._bar.close()
            print("sent; the server is validating it", file=sys.stderr, flush=True)


class LiveLine:
    """One line redrawn in place: `\\r`, the text cut to the terminal's width (a wrapped line could
    not be redrawn by `\\r`), and erase-to-end-of-line; redrawn only when the text changes."""

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout
        self.last: str | None = None
        self.updates = 0

    def update(self, text: str) -> None:
        if text == self.last:
            return
        width = shutil.get_terminal_size((120, 24)).columns - 1
        self.out.write("\r" + text[:width] + "\x1b[K")
        self.out.flush()
        self.last, self.updates = text, self.updates + 1

    def close(self) -> None:
        """Ends the live line: what is printed next starts on a line of its own."""
        if self.last is not None:
            self.out.write("\n")
            self.out.flush()
            self.last = None

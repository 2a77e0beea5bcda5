"""Upload validation: the per-line check, file statistics and the streaming validator.

The upload endpoint feeds the request body through `StreamingValidator` while it writes the body
to storage; the first invalid line fails the upload. Above `full_check_bytes` the validator only
splits lines and checks sizes, and `pipelines/validate_ray.build_validation` checks the rest of
the stored file in parallel from `checked_offset` / `checked_line` on, merging into
`finish()`'s statistics. Both paths scan lines with `scan_lines` and combine the results with
`Tally`, so they report the same first error. The rules themselves live in `pipelines/_rows.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from catalog.bases import BASES
from openft.limits import FINE_TUNE_FILE_BYTES
from pipelines._rows import (
    EMPTY_FILE,
    LINE_CHECKS,
    LINE_TOO_LARGE,
    MAX_LINE_BYTES,
    FileValidationError,
    LineInfo,
    line_too_large,
    too_long,
)

__all__ = [
    "BlockResult",
    "FileStats",
    "FileValidationError",
    "LineInfo",
    "StreamingValidator",
    "Tally",
    "check_line",
    "file_too_large",
    "merge",
    "scan_lines",
]

# How a refusal names a row's kind: by its shape, which is what a person can see in the line.
ROW_SHAPES = {
    "chat": "a chat row (messages with an assistant turn)",
    "preference": "a preference row (input, preferred_output, non_preferred_output)",
    "reinforcement": "a reinforcement row (messages ending with a user turn, no assistant turn)",
}
_MESSAGE_OVERHEAD = max(b.message_overhead_tokens for b in BASES.values())
_ROW_OVERHEAD = max(b.row_overhead_tokens for b in BASES.values())


@dataclass(frozen=True)
class FileStats:
    row_kind: str | None = None  # "chat" | "preference" | "reinforcement"; None for batch files and before the first row
    rows: int = 0
    messages: int = 0
    content_bytes: int = 0  # UTF-8 bytes of every message's content
    bytes: int = 0  # the whole file (or the part these stats cover)

    def token_upper_bound(self) -> int:
        # A byte-level BPE token is at least one byte, so content bytes bound content tokens;
        # the template's markup is bounded by the largest overhead of any base.
        return self.content_bytes + self.messages * _MESSAGE_OVERHEAD + self.rows * _ROW_OVERHEAD

    def token_estimates(self) -> dict[str, int]:
        return {bid: b.estimate_tokens(self.content_bytes, self.messages, self.rows) for bid, b in BASES.items()}


def merge(a: FileStats, b: FileStats) -> FileStats:
    """Statistics of two consecutive parts of one file."""
    if a.row_kind and b.row_kind and a.row_kind != b.row_kind:
        raise ValueError(f"cannot merge {a.row_kind} statistics with {b.row_kind} statistics")
    return FileStats(
        row_kind=a.row_kind or b.row_kind,
        rows=a.rows + b.rows,
        messages=a.messages + b.messages,
        content_bytes=a.content_bytes + b.content_bytes,
        bytes=a.bytes + b.bytes,
    )


def check_line(line: bytes, line_no: int, purpose: str) -> LineInfo:
    """Check one line (without its newline); raises FileValidationError naming `line_no`."""
    try:
        return LINE_CHECKS[purpose](line)
    except FileValidationError as err:
        raise err.at(line_no) from None


@dataclass(frozen=True)
class BlockResult:
    """What one run of consecutive lines says about itself, with lines numbered from 1 locally."""

    lines: int
    stats: FileStats  # row_kind is the kind of the block's first row
    other_kind_line: int = 0  # first line whose kind differs from the first row's; 0: none
    error_line: int = 0  # first invalid line; 0: none
    error_code: str = ""
    error_detail: str = ""
    other_kind: str = ""  # the kind of the row at other_kind_line


def scan_lines(lines: list[bytes], purpose: str, nbytes: int) -> BlockResult:
    """Check consecutive lines; stops at the first invalid line or the first change of row kind."""
    check = LINE_CHECKS[purpose]
    first_kind = None
    messages = content_bytes = 0
    for i, line in enumerate(lines, 1):
        try:
            kind, n, c = check(line)
        except FileValidationError as err:
            stats = FileStats(first_kind, i - 1, messages, content_bytes, nbytes)
            return BlockResult(len(lines), stats, error_line=i, error_code=err.code, error_detail=err.detail)
        if kind != first_kind:
            if i > 1:
                stats = FileStats(first_kind, i - 1, messages, content_bytes, nbytes)
                return BlockResult(len(lines), stats, other_kind_line=i, other_kind=kind or "")
            first_kind = kind
        messages += n
        content_bytes += c
    return BlockResult(len(lines), FileStats(first_kind, len(lines), messages, content_bytes, nbytes))


class Tally:
    """Combines block results in file order; raises the file's first invalid line."""

    def __init__(self, head: FileStats | None = None, start_line: int = 1):
        self.stats = head or FileStats()
        self.lines = start_line - 1  # lines before the next block

    def add(self, block: BlockResult) -> None:
        kind = self.stats.row_kind
        mismatch, other = 0, ""
        if block.stats.row_kind and kind and block.stats.row_kind != kind:
            mismatch, other = 1, block.stats.row_kind  # the block's first row already differs from the file's
        elif block.other_kind_line:
            mismatch, other = block.other_kind_line, block.other_kind
        if block.error_line and not (mismatch and mismatch < block.error_line):
            raise FileValidationError(block.error_code, block.error_detail, self.lines + block.error_line)
        if mismatch:
            file_kind = kind or block.stats.row_kind
            if file_kind == "chat" and other == "reinforcement":
                # In a chat file a row with no assistant turn is a chat row missing what it trains on
                # (the code it had before reinforcement rows existed), not a prompt of another kind.
                raise FileValidationError("invalid_messages", "the row has no assistant message; every row needs one "
                                          "to train on.", self.lines + mismatch)
            raise FileValidationError(
                "mixed_row_kinds",
                f"this is {ROW_SHAPES.get(other, 'another kind of row')} but the file's first row is a {file_kind} "
                "row; a file holds rows of one kind: chat, preference or reinforcement.",
                self.lines + mismatch,
            )
        self.stats = merge(self.stats, block.stats)
        self.lines += block.lines

    def finish(self) -> FileStats:
        if self.lines == 0:
            raise FileValidationError("empty_file", EMPTY_FILE)
        return self.stats


def file_too_large(max_bytes: int) -> FileValidationError:
    size = f"{max_bytes:,} bytes ({max_bytes / 2**20:g} MiB)"
    return FileValidationError("file_too_large", f"the file is over {size}; split it into smaller files.")


class StreamingValidator:
    """Validates a file as its bytes arrive, in chunks with any boundaries.

    `feed` raises at the first invalid line (or once the file passes `max_bytes`), `finish`
    after the last chunk. Lines that start at or after `full_check_bytes` are only split and
    size-checked; `checked_offset`, `checked_line` and `finish()`'s statistics are where a
    `build_validation` over the stored file continues (`complete` says whether it must).
    """

    def __init__(self, purpose: str, *, max_bytes: int = FINE_TUNE_FILE_BYTES, full_check_bytes: int | None = None):
        if purpose not in LINE_CHECKS:
            raise ValueError(f"no line rules for purpose {purpose!r}")
        self.purpose = purpose
        self.max_bytes = max_bytes
        self.full_check_bytes = full_check_bytes
        self.total_bytes = 0
        self.lines = 0  # complete lines seen, checked or only split
        self.checked_offset = 0  # file offset of the first line not fully checked
        self._full = True  # still checking every line
        self._parts: list[bytes] = []  # the line in progress
        self._pending = 0  # its length
        self._last_byte = 0  # the last byte fed
        self._tally = Tally()
        self._error: FileValidationError | None = None

    @property
    def checked_line(self) -> int:
        """The line number at `checked_offset`."""
        return self._tally.lines + 1

    @property
    def complete(self) -> bool:
        """After `finish`: every line was fully checked."""
        return self.checked_offset == self.total_bytes

    def feed(self, chunk: bytes) -> None:
        self._raise_if_failed()
        try:
            room = self.max_bytes - self.total_bytes
            if len(chunk) > room:
                self._feed(chunk[:room])
                raise file_too_large(self.max_bytes)
            self._feed(chunk)
        except FileValidationError as err:
            self._error = err
            raise

    def finish(self) -> FileStats:
        self._raise_if_failed()
        try:
            if self._pending and self._full:
                self._lines([b"".join(self._parts)], final=True)
                self._parts.clear()
            elif self._pending:
                if too_long(self._pending, self._last_byte):
                    raise FileValidationError("line_too_large", LINE_TOO_LARGE, self.lines + 1)
                self.lines += 1
            if not self.lines:
                raise FileValidationError("empty_file", EMPTY_FILE)
        except FileValidationError as err:
            self._error = err
            raise
        return self._tally.stats

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.total_bytes += len(chunk)
        if not self._full:
            self._skim(chunk)
        elif b"\n" in chunk:
            self._parts.append(chunk)
            lines = b"".join(self._parts).split(b"\n")
            last = lines.pop()
            self._parts = [last]
            self._pending = len(last)
            self._lines(lines)
            if not self._full:
                self._parts = []  # from here on only lengths matter
        else:
            self._parts.append(chunk)
            self._pending += len(chunk)
        self._last_byte = chunk[-1]
        if self._pending > _MAX_PENDING:
            raise FileValidationError("line_too_large", LINE_TOO_LARGE, self.lines + 1)

    def _skim(self, chunk: bytes) -> None:
        """Count lines and check their sizes without copying them out of the chunk."""
        first = chunk.find(b"\n")
        if first < 0:
            self._pending += len(chunk)
            return
        if too_long(self._pending + first, chunk[first - 1] if first else self._last_byte):
            raise FileValidationError("line_too_large", LINE_TOO_LARGE, self.lines + 1)
        start, last = first + 1, chunk.rfind(b"\n")
        while start <= last:
            # Only the first line of a window one line-limit wide can reach the limit; skip the rest.
            window = start + MAX_LINE_BYTES + 2
            end = chunk.find(b"\n", start, window)
            if end < 0 or too_long(end - start, chunk[end - 1]):
                line = self.lines + chunk.count(b"\n", 0, start) + 1
                raise FileValidationError("line_too_large", LINE_TOO_LARGE, line)
            start = chunk.rfind(b"\n", start, window) + 1
        self.lines += chunk.count(b"\n")
        self._pending = len(chunk) - last - 1

    def _lines(self, lines: list[bytes], final: bool = False) -> None:
        """Complete lines in order; `final`: one last line without a newline."""
        checked = 0
        if self._full:
            checked = len(lines)
            if self.full_check_bytes is not None:
                checked = _count_starting_within(lines, self.full_check_bytes - self.checked_offset)
                self._full = checked == len(lines)
        if checked:
            head = lines[:checked] if checked < len(lines) else lines
            nbytes = sum(map(len, head)) + (0 if final else len(head))
            self._tally.add(scan_lines(head, self.purpose, nbytes))
            self.checked_offset += nbytes
        for i in range(checked, len(lines)):
            if line_too_large(lines[i]):
                raise FileValidationError("line_too_large", LINE_TOO_LARGE, self.lines + i + 1)
        self.lines += len(lines)


def _count_starting_within(lines: list[bytes], budget: int) -> int:
    """How many of `lines` (each followed by a newline) start within the next `budget` bytes."""
    n = 0
    for line in lines:
        if budget <= 0:
            break
        budget -= len(line) + 1
        n += 1
    return n


# A line in progress longer than this is over the limit whatever ends it (a \r\n ending is allowed).
_MAX_PENDING = MAX_LINE_BYTES + 1

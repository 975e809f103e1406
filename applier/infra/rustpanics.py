"""Rust panics of delta-rs's own threads, held back from the command's stderr.

delta-rs writes through Rust's ``object_store``. When the disk fills up during a write, delta-rs
returns the OS error to Python (which applier turns into one line and exit 3), but one of its tokio
worker threads also panics on the way out ("thread 'tokio-rt-worker' panicked at .../buffered.rs:369:
Already shut down") and Rust's default panic hook prints that, and a stack backtrace when
``RUST_BACKTRACE`` is set, straight to file descriptor 2. Python cannot replace that hook, so the
command line (and only it: a library must not take a process's stderr) puts a pipe on descriptor 2
for the length of a command. A thread copies what comes through to the real stderr as it comes,
except a panic's block of lines (its header, message, backtrace and note), which it holds. The command
then decides: a run that stopped with an error of its own (a full disk) keeps its one line and logs
the held text at debug level (``-v`` shows it); a run that ended well or with an internal error
prints it as Rust would have.

Python's own writes do not take the pipe: ``sys.stderr`` is pointed at the real stderr inside the
block when it was descriptor 2, so applier's lines are never delayed, reordered or lost to an
``os._exit``. What a child process started inside the block (the JVM) inherits is the pipe: its lines
pass through the same way, also after the block ends.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import uuid
from types import TracebackType
from typing import TextIO

#: the first line of Rust's default panic message: "thread 'name' (tid) panicked at file:line:col:"
PANIC_HEADER = re.compile(rb"^thread '[^']*'( \(\d+\))? panicked at ")


class RustPanicFilter:
    """A context manager; ``held`` lists the panic blocks (text) seen while it was active."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self._real = -1
        self._saved_fd2 = -1
        self._token = f"\0applier-stderr-sync-{uuid.uuid4().hex}".encode()
        self._synced = threading.Event()
        self._saved_stderr: TextIO | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RustPanicFilter:
        try:
            self._saved_fd2 = os.dup(2)
            self._real = os.dup(2)
            read_end, write_end = os.pipe()
        except OSError:  # no descriptor 2 to speak of: nothing to filter
            return self
        os.dup2(write_end, 2)
        os.close(write_end)
        if _writes_to_fd2(sys.stderr):
            self._saved_stderr = sys.stderr
            sys.stderr.flush()
            sys.stderr = open(os.dup(self._saved_fd2), "w", buffering=1, encoding=sys.stderr.encoding,  # noqa: SIM115
                              errors="backslashreplace")
        self._thread = threading.Thread(target=self._forward, args=(read_end,), name="applier-native-stderr",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._thread is None:
            for fd in (self._saved_fd2, self._real):
                if fd >= 0:
                    os.close(fd)
            return
        os.write(2, self._token + b"\n")  # everything written before it has been seen once the token has
        self._synced.wait(timeout=5)
        if self._saved_stderr is not None:
            sys.stderr.close()
            sys.stderr = self._saved_stderr
        os.dup2(self._saved_fd2, 2)  # the pipe's write end now lives on only in children started inside
        os.close(self._saved_fd2)

    def _write(self, data: bytes) -> None:
        """To the real stderr; when that is gone (a closed pipe), the lines are dropped, and the pipe is
        still drained so that no writer blocks on it."""
        try:
            os.write(self._real, data)
        except OSError:
            pass

    def _hold(self, block: list[bytes]) -> None:
        self.held.append(b"\n".join(block).decode("utf-8", "replace"))

    def _forward(self, read_end: int) -> None:
        block: list[bytes] = []  # the panic being read: lines held back
        in_frames = False
        blank = b""  # a blank line held until it is known not to open a panic (Rust prints one before it)
        pending = b""
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                out: list[bytes] = []
                synced = False
                for line in lines:
                    if self._token in line:
                        line = line.replace(self._token, b"")
                        if block and in_frames:  # RUST_BACKTRACE=full: the frames end with the command
                            self._hold(block)
                            block, in_frames = [], False
                        synced = True
                        if not line:
                            continue
                    if block:
                        ends, again = _ends_block(line, in_frames)
                        in_frames = in_frames or line == b"stack backtrace:"
                        if not again:
                            block.append(line)
                        if ends:
                            self._hold(block)
                            block, in_frames = [], False
                        if not again:
                            continue
                    if PANIC_HEADER.match(line):
                        block, blank = [line], b""
                        continue
                    out.append(blank)
                    blank = b""
                    if line:
                        out.append(line + b"\n")
                    else:
                        blank = b"\n"
                if not block and pending and not b"thread '".startswith(pending[:8]):
                    out.append(blank + pending)  # a line still being written (a progress bar): show it now
                    blank = pending = b""
                if out:
                    self._write(b"".join(out))
                if synced:
                    self._synced.set()
            tail = b"\n".join(block + ([pending] if pending else []))
            if tail:
                self._write(blank + tail)
        os.close(self._real)


def _ends_block(line: bytes, in_frames: bool) -> tuple[bool, bool]:
    """(does the panic block end with this line, is the line outside it and to be read again)."""
    if line.startswith(b"note: ") and b"RUST_BACKTRACE" in line:
        return True, False
    if in_frames and not line[:1].isspace():  # RUST_BACKTRACE=full: no note after the frames
        return True, True
    return False, False


def _writes_to_fd2(stream: TextIO) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False

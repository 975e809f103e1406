"""The command line's filter of Rust panics on descriptor 2 (issue 47: a full disk is one line, no
backtrace). The panic text is what delta-rs 1.x printed on a full tmpfs (tests/integration/test_full_disk.py
checks the real thing end to end)."""

from __future__ import annotations

import os
import sys

import pytest

from applier.infra.rustpanics import RustPanicFilter

PANIC_WITH_BACKTRACE = (
    b"\nthread 'tokio-rt-worker' (7225) panicked at /home/runner/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/"
    b"object_store-0.13.2/src/buffered.rs:369:41:\nAlready shut down\nstack backtrace:\n"
    b"note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n")
PANIC_PLAIN = (b"\nthread 'tokio-rt-worker' panicked at src/x.rs:1:2:\nfirst line\nsecond line\n"
               b"note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n")
PANIC_FULL = b"thread 'main' panicked at src/y.rs:3:4:\nboom\nstack backtrace:\n   0: std::x\n             at y.rs:1\n"


@pytest.mark.parametrize("panic", [PANIC_WITH_BACKTRACE, PANIC_PLAIN, PANIC_FULL], ids=["1", "unset", "full"])
def test_a_panic_is_held_and_every_other_line_passes(panic: bytes, capfd: pytest.CaptureFixture[str]) -> None:
    with RustPanicFilter() as panics:
        os.write(2, b"before\n")
        os.write(2, panic)
        os.write(2, b"after\n\npartial")
        print("python's own line", file=sys.stderr)
    err = capfd.readouterr().err
    assert "panicked" not in err and "RUST_BACKTRACE" not in err and "   0: std" not in err, err
    assert "before\n" in err and "after\n\npartial" in err and "python's own line" in err, err
    assert len(panics.held) == 1 and panics.held[0].startswith("thread '") and "panicked at" in panics.held[0]
    assert panic.strip().decode().startswith(panics.held[0].strip()), panics.held


def test_a_line_that_only_looks_like_a_panic_passes(capfd: pytest.CaptureFixture[str]) -> None:
    with RustPanicFilter() as panics:
        os.write(2, b"thread pool of 4 panicked at nothing\nthe thread 'x' panicked at y\n")
    assert capfd.readouterr().err == "thread pool of 4 panicked at nothing\nthe thread 'x' panicked at y\n"
    assert panics.held == []

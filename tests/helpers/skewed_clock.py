"""A process's wall clock moved, and nothing else: :func:`skewed_clock`."""

from __future__ import annotations

import contextlib
import time

_REAL_TIME_NS = time.time_ns
_REAL_TIME = time.time


@contextlib.contextmanager
def skewed_clock(seconds: float):
    """This process's wall clock ``seconds`` off (ahead if positive) while inside; its
    monotonic clock is left alone, as a clock step or a host's skew leaves it."""
    offset_ns = int(seconds * 1e9)
    before = time.time_ns, time.time
    time.time_ns = lambda: _REAL_TIME_NS() + offset_ns
    time.time = lambda: _REAL_TIME() + seconds
    try:
        yield
    finally:
        time.time_ns, time.time = before

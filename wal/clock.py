"""The WAL's clock: the wall clock in microseconds, what seals, entries and amendments record
(when they were made) and what a batch's write timestamps start from
(:func:`wal.seal.next_base_timestamp`, which never lets them go backwards)."""

from __future__ import annotations

import time


def now_us() -> int:
    return time.time_ns() // 1000

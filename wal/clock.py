"""The sink's clocks, and the one place a test replaces them.

Every reading of a clock and every pause in the sink's code goes through this module, so that
a test that runs the sink on a clock of its own (the protocol simulation, ``tests/sim``)
replaces ``time`` here, and :func:`machine_id` and :func:`stop_waiting_after`, and nothing
else (``tests/unit/test_clock_seam.py`` fails when a module reads ``time`` on its own again):

* :func:`now_us`, :func:`wall_s`, :func:`wall_ns`: the wall clock, what seals, entries and
  amendments record (when they were made) and what a batch's write timestamps start from
  (:func:`wal.seal.next_base_timestamp`, which never lets them go backwards);
* :func:`monotonic`, :func:`monotonic_ns`: timeouts, rates, and ages measured on one host
  (:mod:`cql.clock`), with :func:`machine_id` naming whose monotonic clock it is;
* :func:`sleep`, and :func:`stop_waiting_after`, how long to wait for another process (a
  finishing job, a stopping flusher) to let go of something.
"""

from __future__ import annotations

import os
import socket
import time

from tenacity import stop_after_delay

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_machine: str | None = None


def now_us() -> int:
    return time.time_ns() // 1000


def wall_ns() -> int:
    return time.time_ns()


def wall_s() -> float:
    return time.time()


def monotonic() -> float:
    return time.monotonic()


def monotonic_ns() -> int:
    return time.monotonic_ns()


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def machine_id() -> str:
    """The machine whose monotonic clock this process reads: the kernel's boot id (shared by
    every process, container or not, of one boot of one machine), else this host and process
    (no other process is then taken to share its monotonic clock)."""
    global _machine
    if _machine is None:
        try:
            with open(_BOOT_ID) as f:
                _machine = "boot:" + f.read().strip()
        except OSError:
            _machine = f"process:{socket.gethostname()}:{os.getpid()}"
    return _machine


def stop_waiting_after(seconds: float):
    """tenacity's stop for a wait on another process to let go: after ``seconds``."""
    return stop_after_delay(seconds)

"""``kill -9`` of the whole driver machine from outside, at a seeded random instant.

The instant is drawn with ``random.Random(seed)``: after the k-th batch the run commits plus
up to a second, or for k = 0 up to 8 s after Spark is up (recovery, the first batch). With
``--full-matrix`` a third of the seeds kill a second time, on the restarted run, before the
clean run that finishes. Every failure message names the seed: rerun one with
``pytest tests/crash/test_random_kills.py --seeds N -k seedS``.

On a store (``storage.py``): the default suite runs one trial, on HDFS, restarted "on another
host" (the driver's working copy deleted after the kill), and no local one (``--seeds N``); ``--full-matrix`` runs every seed on
HDFS and on S3, the odd seeds on another host.

On the scale-out path (``wal.flush.mode=executors``: every batch, and a restart's backlog,
written by Spark tasks): the default suite runs one local trial; ``--full-matrix`` the first
five seeds on a local folder, HDFS and S3.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from tests.helpers.matrix import full_matrix
from .harness import crash_harness  # noqa: F401 - fixture
from .storage import HDFS, LOCAL, S3

pytestmark = [pytest.mark.integration, pytest.mark.crash]


@dataclass(frozen=True)
class KillTrial:
    seed: int
    storage: str = LOCAL
    lose_working_copy: bool = False
    flush_mode: str = "driver"

    @property
    def id(self) -> str:
        mode = "" if self.flush_mode == "driver" else f"{self.flush_mode}-"
        if self.storage == LOCAL:
            return f"{mode}seed{self.seed}"
        return (f"{self.storage}-{mode}{'lost-copy-' if self.lose_working_copy else ''}"
                f"seed{self.seed}")


#: Seeds of the scale-out trials with --full-matrix, on each storage.
SCALE_OUT_SEEDS = 5


def trials(full: bool, seeds: int) -> list[KillTrial]:
    """Called by tests/crash/conftest.py to parametrize ``kill_trial``."""
    local = [KillTrial(s) for s in range(1, seeds + 1)]
    if not full:
        return local + [KillTrial(1, HDFS, lose_working_copy=True),
                        KillTrial(5, flush_mode="executors")]
    return local + [KillTrial(s, storage, lose_working_copy=s % 2 == 1)
                    for storage in (HDFS, S3) for s in range(1, seeds + 1)] + [
        KillTrial(s, storage, lose_working_copy=storage != LOCAL and s % 2 == 1,
                  flush_mode="executors")
        for storage in (LOCAL, HDFS, S3) for s in range(1, SCALE_OUT_SEEDS + 1)]


def test_random_kill_restart_finish(crash_harness, kill_trial, request):  # noqa: F811
    seed = kill_trial.seed
    rng = random.Random(seed)
    note = f"{kill_trial.id}: seed {seed} (random.Random({seed}))"
    crash_harness.flush_mode = kill_trial.flush_mode
    if kill_trial.lose_working_copy:
        crash_harness.restart_on_another_host()
    crash_harness.kill_randomly(rng, note)
    if full_matrix(request.config) and rng.random() < 1 / 3:
        crash_harness.kill_randomly(rng, note + ", second kill")
    crash_harness.finish()
    crash_harness.check(note)

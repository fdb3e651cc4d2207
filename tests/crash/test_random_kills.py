"""``kill -9`` of the whole driver machine from outside, at a seeded random instant.

The instant is drawn with ``random.Random(seed)``: after the k-th batch the run commits plus
up to a second, or for k = 0 up to 8 s after Spark is up (recovery, the first batch). With
``--full-matrix`` a third of the seeds kill a second time, on the restarted run, before the
clean run that finishes. Every failure message names the seed: rerun one with
``pytest tests/crash/test_random_kills.py --seeds N -k seedS``.
"""

from __future__ import annotations

import random

import pytest

from .conftest import full_matrix
from .harness import crash_harness  # noqa: F401 - fixture

pytestmark = [pytest.mark.integration, pytest.mark.crash]


def test_random_kill_restart_finish(crash_harness, kill_seed, request):  # noqa: F811
    rng = random.Random(kill_seed)
    note = f"seed {kill_seed} (random.Random({kill_seed}))"
    crash_harness.kill_randomly(rng, note)
    if full_matrix(request.config) and rng.random() < 1 / 3:
        crash_harness.kill_randomly(rng, note + ", second kill")
    crash_harness.finish()
    crash_harness.check(note)

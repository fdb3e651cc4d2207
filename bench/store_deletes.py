"""Deleting a batch's segments on S3: one DeleteObject a key (before issue 32) against
``S3Store.delete_many`` (one DeleteObjects per 1,000 keys) and ``delete_folder(recursive=True)``
(a listing, then DeleteObjects: what a flushed batch's removal does now), on the moto S3 server
of ``scripts/s3``, started here and stopped and purged at the end whatever happens.

Each round publishes ``--segments`` small objects under ``segments/<batch>/`` and deletes them
one way; the ways alternate, their order rotating each round. Requests are counted on the wire
(botocore's ``before-send``); time is the wall time of the delete alone, median over rounds.

    .venv/bin/python bench/store_deletes.py [--segments 2000] [--rounds 3] [--out PATH]

Prints a markdown table and writes ``bench/results/store_deletes.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.helpers.net import free_port  # noqa: E402
from wal.s3 import S3Store  # noqa: E402

BUCKET = "bench-bucket"


def one_at_a_time(store: S3Store, folder: str) -> None:
    for key in store.list(folder):          # what RemoteWal.delete_segments did
        store.delete(key)


WAYS = {
    "DeleteObject a key (before)": one_at_a_time,
    "delete_many (DeleteObjects)": lambda store, folder: store.delete_many(store.list(folder)),
    "delete_folder recursive": lambda store, folder: store.delete_folder(folder, recursive=True),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "store_deletes.json"))
    args = ap.parse_args()

    import boto3

    folder = tempfile.mkdtemp(prefix="bench-s3-")
    port = free_port()
    s3 = [str(REPO / "scripts" / "s3")]
    endpoint = subprocess.run(
        s3 + ["start", "--port", str(port), "--dir", folder, "--bucket", BUCKET],
        capture_output=True, text=True, check=True, timeout=120).stdout.strip().splitlines()[-1]
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        sent: list[str] = []
        client.meta.events.register("before-send.s3", lambda request, **_: sent.append(
            request.method))
        results: dict[str, dict] = {way: {"seconds": [], "requests": []} for way in WAYS}
        names = list(WAYS)
        for round_ in range(args.rounds):
            for way in names[round_ % len(names):] + names[:round_ % len(names)]:
                store = S3Store(BUCKET, f"wal-{uuid.uuid4().hex[:8]}", client=client)
                batch = "segments/00000000000000000007"
                for i in range(args.segments):
                    store.create(f"{batch}/{i:05d}-0-{uuid.uuid4().hex[:12]}.seg", b"x" * 64)
                sent.clear()
                started = time.perf_counter()
                WAYS[way](store, batch)
                results[way]["seconds"].append(round(time.perf_counter() - started, 3))
                results[way]["requests"].append(len(sent))
                assert store.list(batch) == [], way
    finally:
        subprocess.run(s3 + ["stop", "--port", str(port), "--dir", folder, "--purge"],
                       capture_output=True, timeout=120)
    print(f"| {args.segments} segments on moto S3 | requests | seconds (median of "
          f"{args.rounds}) | all rounds |\n|---|---|---|---|")
    for way, r in results.items():
        print(f"| {way} | {r['requests'][0]} | {statistics.median(r['seconds']):.2f} | "
              f"{r['seconds']} |")
    out = {"bench": "store_deletes", "date": dt.datetime.now(dt.timezone.utc).isoformat(),
           "host": platform.node(), "python": platform.python_version(),
           "command": " ".join(["bench/store_deletes.py", *sys.argv[1:]]),
           "segments": args.segments, "rounds": args.rounds, "results": results}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

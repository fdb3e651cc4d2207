"""Draw the outage test's backlog, as the metrics endpoint reported it, for the user guide.

The samples are the scrapes of ``tests/integration/test_outage.py::
test_a_cassandra_outage_is_absorbed_and_drained_in_order`` (one a second, from the driver's
``wal.metrics.port`` endpoint), kept when the test runs with
``CASSANDRA_WAL_OUTAGE_SAMPLES=FILE.json``::

    CASSANDRA_WAL_OUTAGE_SAMPLES=/tmp/outage.json .venv/bin/python -m pytest \\
        tests/integration/test_outage.py -k absorbed
    .venv/bin/python bench/plot_outage.py /tmp/outage.json docs/img/outage-backlog.png

Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", help="the JSON file the outage test kept")
    parser.add_argument("png", help="where to write the picture")
    args = parser.parse_args()
    with open(args.samples) as f:
        doc = json.load(f)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in doc["samples"]]
    metric = {name: [s[1].get(f"cassandra_wal_{name}") for s in doc["samples"]]
              for name in ("pending_rows", "pending_batches", "oldest_pending_age_seconds",
                           "retries_total")}
    fig, (rows, age) = plt.subplots(2, 1, sharex=True, figsize=(8, 5), dpi=100)
    rows.step(t, metric["pending_rows"], where="post", label="cassandra_wal_pending_rows")
    rows.set_ylabel("rows pending")
    twin = rows.twinx()
    twin.step(t, metric["retries_total"], where="post", color="tab:red", alpha=0.6,
              label="cassandra_wal_retries_total")
    twin.set_ylabel("retries (total)")
    age.plot(t, metric["oldest_pending_age_seconds"], color="tab:green",
             label="cassandra_wal_oldest_pending_age_seconds")
    age.axhline(30, color="grey", linestyle=":", label="lagging after 30 s")
    age.set_ylabel("oldest pending (s)")
    age.set_xlabel("seconds since the query started")
    for ax in (rows, age):
        ax.axvspan(doc["node_stopped_s"], doc["node_started_s"], color="tab:orange", alpha=0.15,
                   label="Cassandra down (stopped until started again)" if ax is rows else None)
    handles = rows.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    labels = rows.get_legend_handles_labels()[1] + twin.get_legend_handles_labels()[1]
    rows.legend(handles, labels, loc="upper left", fontsize=8)
    age.legend(loc="upper left", fontsize=8)
    fig.suptitle("A 35 s Cassandra outage: the backlog rises, then drains "
                 "(tests/integration/test_outage.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.png)


if __name__ == "__main__":
    main()

"""Contestants of ``bench/bench_sinks.py``: each runs in its own process and prints one
``RESULT {json}`` line. ``common`` is stdlib-only so that the SCC contestant can import it
from its pyspark 3.5 venv."""

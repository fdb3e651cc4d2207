"""What Spark's Python workers load: the sink's side that turns a DataFrame into sealed WAL
batches, and the flush job's task.

* :mod:`sinks.worker.source`: the data source whose methods Spark calls in its workers
  (prepare, stage, seal), through :mod:`sinks.worker.plan`, which parses the options
  (:mod:`sinks.worker.options`) and checks the DataFrame (:mod:`sinks.worker.validation`).
* :mod:`sinks.worker.foreach_batch`: the same for a ``foreachBatch`` function (called in the
  driver process; its staging tasks run here).
* :mod:`sinks.worker.batch_jobs`: a batch ``df.write`` job's flush, in Spark's commit worker.
* :mod:`sinks.worker.flush_task`: each task of a flush job on the executors.

Nothing here imports :mod:`sinks.driver` (an import contract in ``pyproject.toml``), so that
a one-shot worker, which imports ``sinks`` to unpickle what it runs, stays light.
"""

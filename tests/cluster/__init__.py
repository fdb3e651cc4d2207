"""Multi-executor tests: the sink under executors in separate JVMs (``local-cluster``) and on
two hosts (a small standalone cluster on loopback addresses). See ``test_multi_executor.py``."""

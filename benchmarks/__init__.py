"""Throughput measurements that print figures and write JSON rows (not tests; see tests/test_benchmarks.py)."""

"""Benchmarks that print a table against baselines measured in the same run.

Not tests: they never fail on a miss. Run `python -m bench.bench_engine` from the repo root.
"""

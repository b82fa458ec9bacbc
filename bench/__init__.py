"""Benchmarks of tune_magic; entry point: bench/run.py (see BENCHMARKS.md)."""

"""Benchmarks: each measures what it compares side by side in one run and prints ratios."""

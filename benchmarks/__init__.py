"""Benchmarks: one script per measurement, each printing a table of ratios."""

"""Reproducible benchmarks; `make bench` runs them and prints figures (bench/README.md keeps the latest)."""

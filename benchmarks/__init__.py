"""Benchmark scripts, each run as a module from the repository root: `python -m benchmarks.bench_sim`
(README.md, "Benchmarks"). Not part of the wheel."""

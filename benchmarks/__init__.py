"""Benchmarks of the engine and the playground: `python -m benchmarks.bench|browser|load|model` (README.md)."""

"""Benchmarks behind ``gpctl bench``: speed and memory goals live here, never in timed tests."""

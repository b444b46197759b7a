"""The benchmarks (bench/README.md). Each script also runs as a file
(`python bench/suite.py`, as `make bench` does); they share the process harness
(harness/) with the tests and chaos experiments and never import tests/."""

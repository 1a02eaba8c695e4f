"""rte's tools, run from a checkout (never installed): benchmarks and the GPU check."""

"""rte's tools: benchmarks (``rte bench-*``) and, later, the debug tool."""

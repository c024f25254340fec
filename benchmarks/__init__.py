"""Benchmarks: one script per question; each states its conditions, prints a table and ends with one
JSON line. They talk HTTP (or run the core in-process) and never import `deployments`."""

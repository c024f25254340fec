"""Headless matplotlib for the benchmarks' PNGs (no display on servers or CI)."""

from __future__ import annotations


def subplots(*args, **kwargs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)

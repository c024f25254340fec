"""Thin Ray Serve adapters over the `tandem` core: one deployment class per file, bound by `app.py`.
This is the only package that imports `ray.serve`."""

"""Tandem's Ray-free core: config, wire types, prompts, policies, selectors, the pipeline and engines.

Nothing under this package imports ray, starlette or fastapi; the Serve adapters in `deployments/`
wrap it.
"""

__version__ = "0.1.0"

"""Config is validated once, at the edge: an unknown or bad key must fail with its name, not be
ignored (a typo in a threshold would otherwise silently run the default)."""

import pytest

from tandem.config import TandemConfig, load_tandem_config
from tandem.errors import ConfigError


def test_defaults_serve_the_trained_pair():
    cfg = load_tandem_config({})
    assert (cfg.small.model, cfg.large.model, cfg.policy.default) == ("trained:small", "trained:large", "mutual")
    assert (cfg.small.reasoning_format, cfg.large.reasoning_format) == ("think_tags", "prompted")


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="unknown key 'policy.treshold'"):
        load_tandem_config({"policy": {"treshold": 0.3}})


def test_bad_value_is_named_with_value():
    with pytest.raises(ConfigError, match=r"'policy.default'.*'fastest'"):
        load_tandem_config({"policy": {"default": "fastest"}})


def test_pixel_bounds_must_be_ordered():
    with pytest.raises(ConfigError, match="min_pixels"):
        load_tandem_config({"small": {"model": "tiny:small", "min_pixels": 10, "max_pixels": 5}})


def test_config_is_immutable():
    cfg = TandemConfig()
    with pytest.raises(Exception):
        cfg.policy = None

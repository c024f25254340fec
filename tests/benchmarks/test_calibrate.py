"""Calibration: the threshold it picks gives the asked-for transfer rate on the items it saw, its
accuracy arithmetic is the policy's, and the whole command runs in-process on the trained pair and
writes an overlay Tandem's config accepts."""

import json

import pytest
import yaml

from benchmarks.calibrate import accuracy_at, choose_threshold, main, transfer_rate
from tandem.config import load_tandem_config


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_threshold_gives_the_target_rate_on_its_own_items(rate):
    values = [i / 20 + 0.01 for i in range(20)]
    t = choose_threshold(values, rate)
    assert transfer_rate(values, t) == pytest.approx(rate)
    assert 0.0 <= t <= 1.0


def test_ties_at_the_cut_are_not_split():
    values = [0.2, 0.5, 0.5, 0.5, 0.9]
    assert transfer_rate(values, choose_threshold(values, 0.4)) == pytest.approx(0.2)  # 0.5s stay together


def test_accuracy_takes_the_transfer_below_the_threshold_and_the_large_above():
    conf = [(0.1, False), (0.4, True), (0.8, True), (0.95, False)]
    transfer_right = [True, False, False, True]
    assert accuracy_at(0.0, conf, transfer_right) == 0.5  # never transfer: the large model's 2 of 4
    assert accuracy_at(0.5, conf, transfer_right) == 0.5  # item 0 fixed, item 1 broken
    assert accuracy_at(1.0, conf, transfer_right) == 0.5  # always transfer
    assert accuracy_at(0.2, conf, transfer_right) == 0.75


def test_calibrate_in_process_writes_an_overlay_the_config_accepts(tmp_path, capsys):
    out = tmp_path / "overlay.yaml"
    assert main(["--target-transfer-rate", "0.25", "--n", "8", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["transfer_rate"] == 0.25 and result["n"] == 8
    args = yaml.safe_load(out.read_text())["applications"][0]["args"]
    assert load_tandem_config(args).policy.confidence_threshold == pytest.approx(result["threshold"])

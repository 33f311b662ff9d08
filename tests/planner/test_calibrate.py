"""bench/calibrate.py's arithmetic, without its timings: a machine's own runs fed to the model as
a local instance type, and its predictions set beside measured figures row by row."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from infra.models import PRESETS
from tests.conftest import REPO


@pytest.fixture(scope="module")
def calibrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate", REPO / "bench" / "calibrate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = module
    spec.loader.exec_module(module)
    return module


MODEL = PRESETS["llama-3.1-8b-q4_0"]


def test_the_local_machine_reproduces_the_runs_it_was_measured_by(calibrate: ModuleType) -> None:
    machine = calibrate.Machine(decode_tps=8.0, kv_tokens=32, repacked_prompt_tps=60.0,
                                plain_prompt_tps=40.0)  # fmt: skip
    node = machine.node(MODEL)
    assert node.repacked_flops and node.plain_flops and node.repacked_flops > node.plain_flops
    found = calibrate.predict(MODEL, node, prompt=128, generate=64, draft_max=4,
                              acceptance={"one node": 1.0, "two workers": 1.0},
                              workers_repack=False)  # fmt: skip
    one, two = found["one node"], found["two workers"]
    # The calibration's own runs come back: a decode at its KV cache, a prompt of its length.
    assert one["decode_tps"] == pytest.approx(8.0)
    assert one["prompt_tps"] == pytest.approx(60.0, rel=1e-6)
    # Through workers: one hop each, and the plain kernels where they hold every layer.
    assert two["decode_tps"] < one["decode_tps"] and two["prompt_tps"] < one["prompt_tps"]
    assert one["verify_4_seconds"] < one["verify_8_seconds"]
    nothing = calibrate.predict(MODEL, node, prompt=128, generate=64, draft_max=4,
                                acceptance={"one node": 0.0, "two workers": 0.0},
                                workers_repack=False)  # fmt: skip
    # The model drafting for itself: every step pays k decodes of its own size, so only a run
    # of accepted tokens can pay for them.
    assert nothing["one node"]["draft_speedup"] < one["draft_speedup"]
    assert nothing["one node"]["draft_speedup"] < 1


def test_rows_set_each_rounds_prediction_beside_its_measurement(calibrate: ModuleType) -> None:
    """A row's ratio is the median of each round's own ratio, not a ratio of medians: a round
    whose machine ran slow predicts slow and measures slow."""
    predicted = [
        {"one node": {"decode_tps": 10.0, "prompt_tps": 100.0}},
        {"one node": {"decode_tps": 5.0, "prompt_tps": 100.0}},
        {"one node": {"decode_tps": 10.0, "prompt_tps": 100.0}},
    ]
    measured = [
        {"one node": {"decode_tps": 9.0, "prompt_tps": 50.0}},
        {"one node": {"decode_tps": 4.5, "prompt_tps": 50.0}},
        {"one node": {"decode_tps": 9.0}},
    ]
    rows = calibrate.compare_rounds(predicted, measured)
    assert [(r["what"], r["ratio"], r["within_25_percent"]) for r in rows] == [
        ("decode_tps", 1.111, True),
        ("prompt_tps", 2.0, False),
    ]
    assert rows[0]["ratio_rounds"] == [1.111, 1.111, 1.111]
    assert (rows[0]["predicted"], rows[0]["measured"]) == (10.0, 9.0)
    assert len(rows[1]["ratio_rounds"]) == 2  # a round without the figure is left out
    assert calibrate.layouts(MODEL, 256)["two workers"].layers == (0, 16, 16)


def test_a_round_reads_the_machine_and_the_figures_it_ran(calibrate: ModuleType) -> None:
    runs = {
        "machine decode": [30.0, 20.0],
        "machine prompt repacked": [200.0, 150.0],
        "machine prompt plain": [100.0, 90.0],
        "one node prompt_tps": [180.0, 170.0],
        "one node verify_4": [80.0, 40.0],
        "one node verify_8": [100.0, 80.0],
        "two workers decode_tps": [25.0, 24.0],
        "two workers prompt_tps": [160.0, 150.0],
        "two workers verify_4": [70.0, 60.0],
        "two workers verify_8": [90.0, 85.0],
    }
    machine = calibrate.machine_of(runs, 1, 32, one_row_rereads=True)
    assert (machine.decode_tps, machine.repacked_prompt_tps, machine.plain_prompt_tps) == (
        20.0, 150.0, 90.0
    )  # fmt: skip
    assert machine.node(MODEL).one_row_rereads
    # A file recorded before the five-token step was measured has no such row.
    found = calibrate.measured_of(runs, 1)
    assert found["one node"] == {
        "decode_tps": 20.0, "prompt_tps": 170.0, "verify_4_seconds": 0.1, "verify_8_seconds": 0.1
    }  # fmt: skip
    assert found["two workers"]["verify_4_seconds"] == pytest.approx(4 / 60)
    runs["one node verify_5"] = [50.0, 25.0]
    assert calibrate.measured_of(runs, 1)["one node"]["verify_5_seconds"] == pytest.approx(0.2)


def test_the_core_cache_is_read_as_the_kernel_lists_it(calibrate: ModuleType, tmp_path) -> None:
    for index, level, size in (("index0", "1", "48K"), ("index2", "2", "2048K"),
                               ("index3", "3", "32768K")):  # fmt: skip
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(level + "\n")
        (tmp_path / index / "size").write_text(size + "\n")
    assert calibrate.core_cache_bytes(tmp_path) == 2 * 2**20
    (tmp_path / "index2" / "level").write_text("4\n")
    with pytest.raises(SystemExit, match="no level 2 cache"):
        calibrate.core_cache_bytes(tmp_path)

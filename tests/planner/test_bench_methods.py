"""How the benchmarks the planner's rates come from repeat and time their runs (bench/rounds.py,
bench/load.py), checked without timing anything real."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from bench import load
from bench.rounds import interleaved, spread


def test_every_arm_runs_once_a_round_in_abba_order() -> None:
    order = list(interleaved(["a", "b", "c"], 4))
    assert [arm for _, arm in order] == list("abccbaabccba")
    assert [r for r, _ in order] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3


def test_a_spread_keeps_every_value() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0]) == {
        "values": [3.0, 1.0, 2.0, 10.0], "median": 2.5, "min": 1.0, "max": 10.0
    }  # fmt: skip


def fake_server(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text("#!/usr/bin/env bash\n" + body)
    server.chmod(0o755)
    return bin_dir


# What the stand-in does once "loaded": answers every request 200 on the port it was given.
SERVE = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


def test_a_load_is_timed_to_the_servers_own_log_line_not_a_poll(tmp_path: Path) -> None:
    """The server logs a great deal, then says the model is loaded 0.3 s after it starts and
    serves: the time is that line's, to well within the 50 ms a poll would add, and the
    server is stopped once it answers."""
    (tmp_path / "serve.py").write_text(SERVE)
    bin_dir = fake_server(
        tmp_path,
        f"""
echo $$ >{tmp_path}/pid
while [[ $1 != --port ]]; do shift; done
for i in $(seq 2000); do echo "load_tensors: line $i of the loader's log" >&2; done
sleep 0.3
echo "srv    load_model: model loaded" >&2
exec {sys.executable} {tmp_path}/serve.py "$2"
""",
    )
    seconds = load.seconds_to_loaded(bin_dir, tmp_path / "model.gguf", [], {})
    assert 0.3 <= seconds < 0.3 + 0.25
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


def test_a_server_that_ends_before_it_loads_is_an_error(tmp_path: Path) -> None:
    bin_dir = fake_server(tmp_path, 'echo "error loading model" >&2\nexit 1\n')
    with pytest.raises(RuntimeError, match="exited while loading"):
        load.seconds_to_loaded(bin_dir, tmp_path / "model.gguf", ["-t", "1"], {})


def test_each_rounds_value_comes_from_that_rounds_runs_alone() -> None:
    seconds = {"a": {2: [1.0, 2.0, 1.5], 8: [3.0, 6.0, 4.0]}}
    got = load.per_round(seconds, 3, lambda at: at("a", 8) - at("a", 2))
    assert got == {"values": [2.0, 4.0, 2.5], "median": 2.5, "min": 2.0, "max": 4.0}

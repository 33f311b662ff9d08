"""The local cluster's settings: each bad value is refused with the option named, before any
node, namespace or state directory exists. Nothing here boots a node."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infra.cli.local import main
from infra.local.options import UpOptions, plan_placement, state_dir
from tests.models.test_models import write_gguf


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A 3-layer GGUF of about 1 MB: a header is all the placement reads."""
    return write_gguf(tmp_path / "m.gguf")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--context", "0"], "--context 0 --slots 1: give a positive context and 1 to 64 slots"),
        (["--slots", "65"], "--context 4096 --slots 65: give a positive context and 1 to 64"),
        (["--workers", "16"], "--workers 16: give 0 to 15 workers"),
        # 1.9 GiB of 2 usable is gone to the OS: nothing holds the model.
        (["--node-memory-gib", "2"], "raise --node-memory-gib, or lower --context or --slots"),
        # A spend guard powers its node off, which only a machine has (not this host).
        (["--stop-after-idle-minutes", "1"], "--stop-after-idle-minutes: a spend guard powers"),
        (["--stop-after-hours", "0.5"], "add --machines"),
        (["--stop-after-hours", "-1"], "--stop-after-hours -1: give a positive number"),
        (["--draft-max", "0"], "--draft-max 0: give 1 to 64 tokens"),
        (["--draft-model", "x.gguf"], "--draft-model: x.gguf does not exist or is not a file"),
        (
            ["--patches-off", "0009"],
            "--patches-off: no patch '0009' for llama.cpp 0c1e57098bba; "
            "its patches: 0001, 0002, 0003, 0004, or all",
        ),
    ],
)
def test_bad_settings_are_refused_before_anything_starts(
    capsys, tmp_path: Path, model: Path, args: list[str], message: str
) -> None:
    cache = tmp_path / "cache"
    code = main(["up", "--model", str(model), "--source", str(tmp_path), "--cache", str(cache),
                 "--loopback", "--id", "cli", *args])  # fmt: skip
    assert code == 2 and message in capsys.readouterr().err
    assert not state_dir(cache, "cli").exists()


def test_start_without_a_cluster_says_none_is_up(capsys, tmp_path: Path) -> None:
    assert main(["start", "--cache", str(tmp_path), "--id", "none"]) == 1
    assert "no local cluster 'none' is up" in capsys.readouterr().err


def test_a_file_that_is_not_a_model_is_named(capsys, tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    code = main(["up", "--model", str(text), "--source", str(tmp_path),
                 "--cache", str(tmp_path / "cache"), "--loopback"])  # fmt: skip
    assert code == 2
    assert f"error: --model: {text} is not a GGUF file" in capsys.readouterr().err


def test_context_slots_and_node_memory_reach_the_placement(tmp_path: Path) -> None:
    """--context and --slots size every node's KV cache; --node-memory-gib is each node's memory."""
    model = write_gguf(tmp_path / "m.gguf", layers=6)
    options = UpOptions(
        workers=2, model=model, source=tmp_path, cache=tmp_path, context_size=1024, slots=2,
        node_memory_bytes=8 * 1024**3,
    )  # fmt: skip
    one = plan_placement(options)
    two = plan_placement(dataclasses.replace(options, slots=4))
    assert one.layers == two.layers == (2, 2, 2)
    assert [b.kv_bytes for b in two.shares] == [2 * a.kv_bytes for a in one.shares]
    assert {s.usable_bytes for s in one.shares} == {int(8 * 1024**3 * 0.95) - 2 * 1024**3}


def test_machines_that_cannot_run_fall_back_to_processes_and_say_why(
    capsys, tmp_path: Path, model: Path
) -> None:
    code = main(["up", "--machines", "--model", str(model), "--source", str(tmp_path),
                 "--cache", str(tmp_path / "cache"), "--loopback", "--context", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--context 0" in err  # the settings are still checked, after the note
    assert "note: machines need network namespaces: the nodes run as processes" in err


def test_an_unknown_delivery_is_refused_with_the_clouds_named(capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["up", "--machines", "--delivery", "aws,oracle", "--cache", str(tmp_path)])
    assert exit_.value.code == 2
    assert "--delivery: 'aws,oracle': give clouds from aws, gcp, azure" in capsys.readouterr().err


def test_a_patch_turned_off_reaches_every_nodes_settings(tmp_path: Path, model: Path) -> None:
    """--patches-off sets each named patch's switch for every node (llama.cpp reads it at run
    time: no rebuild); the others keep theirs unset."""
    import ipaddress

    from infra.local.nodes import Where, node_boot

    options = UpOptions(workers=2, model=model, source=tmp_path, cache=tmp_path / "c",
                        patches_off=("0002", "0004"))  # fmt: skip
    ips = ["10.0.0.10", "10.0.0.11", "10.0.0.12"]
    where = Where(ips[0], ipaddress.IPv4Network("10.0.0.0/24"), ips, plan_placement(options))
    for role in ("main", "worker"):
        env = node_boot(options, role, where).env()
        assert env["LLAMA_LOAD_PARALLEL"] == env["GGML_RPC_INFLIGHT_MB"] == "0"
        assert env["GGML_REPACK_THREADS"] == "1"
        assert "GGML_RPC_SKIP_HASH" not in env and "LLAMA_MMAP_POPULATE" not in env

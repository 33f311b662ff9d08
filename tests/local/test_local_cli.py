"""The local cluster's settings: each bad value is refused with the option named, before any
node, namespace or state directory exists. Nothing here boots a node."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest

from infra.boot.group import group_boots
from infra.cli.local import main
from infra.clouds import FACTS
from infra.core.limits import MAX_REPLICAS, Role
from infra.local.netns import VpcNetwork
from infra.local.nodes import machine_node, node_boots, node_layout, serving_group
from infra.local.options import (
    SETTING_FLAGS,
    OptionError,
    UpOptions,
    plan_placement,
    state_dir,
    validate,
)
from infra.stack.settings import MAX_CONTEXT
from tests.models.test_models import write_gguf
from tests.pulumi_mocks import refusal


def boot_env(options: UpOptions, role: Role) -> dict[str, str]:
    """The settings a node of the first group gets (10.0.0.0/24: main .10, workers .11, ...)."""
    ips = [f"10.0.0.{10 + i}" for i in range(options.workers + 1)]
    cidr = ipaddress.IPv4Network("10.0.0.0/24")
    group = serving_group(options, ips, cidr, plan_placement(options), on_machine=False)
    main, *workers = group_boots(group)
    return (main if role == "main" else workers[0]).env()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A 3-layer GGUF of about 1 MB: a header is all the placement reads."""
    return write_gguf(tmp_path / "m.gguf")


def up_refuses(capsys, tmp_path: Path, *args: str) -> str:
    """``lrc local up`` with these flags, serving a 3-layer GGUF: refused (exit 2) before any
    state exists; its error."""
    model, cache = write_gguf(tmp_path / "m.gguf"), tmp_path / "cache"
    code = main(["up", "--model", str(model), "--source", str(tmp_path), "--cache", str(cache),
                 "--loopback", "--id", "cli", *args])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert not state_dir(cache, "cli").exists()
    return err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # 1.9 GiB of 2 usable is gone to the OS: nothing holds the model.
        (["--node-memory-gib", "2"], "raise --node-memory-gib, or lower --context or --slots"),
        # A spend guard powers its node off, which only a machine has (not this host).
        (["--stop-after-idle-minutes", "1"], "--stop-after-idle-minutes: a spend guard powers"),
        (["--stop-after-hours", "0.5"], "add --machines"),
        (["--stop-after-hours", "-1"], "--stop-after-hours -1: give 0 (off) to 720"),
        (["--stop-after-idle-minutes", "10081"], "--stop-after-idle-minutes 10081: give 0 (off)"),
        (["--draft-model", "x.gguf"], "--draft-model: x.gguf does not exist or is not a file"),
        (["--threads", "0"], "--threads 0: give 1 or more"),
        (["--worker-wait", "0"], "--worker-wait 0: give 1 or more"),
        # The staged model is read from the cluster's store by machines (not this host's).
        (["--staged", "--worker-local"], "--staged: the nodes read the staged model from the"),
        # Checked by the node's boot settings, named by the flag that gave it.
        (["--model-sha256", "abc"], "error: --model-sha256: 'abc' is not a 64-character"),
    ],
)
def test_bad_settings_are_refused_before_anything_starts(
    capsys, tmp_path: Path, args: list[str], message: str
) -> None:
    assert message in up_refuses(capsys, tmp_path, *args)


P = "llama-rpc-cluster:"
DRAFT = {"preset": "llama-3.1-8b-q4_0", "urls": ["https://example.com/Llama-3.1-8B-Q4_0.gguf"]}
# Flags that stand for a stack's settings, each with a value the setting refuses: (the setting,
# a stack's settings that give it, the flags that give it to `lrc local up`).
SAME_REFUSALS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("workerCount", {f"{P}workerCount": 16}, ["--workers", "16"]),
    ("workerCount", {f"{P}workerCount": -1}, ["--workers", "-1"]),
    ("replicas", {f"{P}replicas": 0}, ["--replicas", "0"]),
    ("replicas", {f"{P}replicas": MAX_REPLICAS + 1}, ["--replicas", str(MAX_REPLICAS + 1)]),
    ("contextSize", {f"{P}contextSize": 0}, ["--context", "0"]),
    ("contextSize", {f"{P}contextSize": MAX_CONTEXT + 1}, ["--context", str(MAX_CONTEXT + 1)]),
    ("slots", {f"{P}slots": 65}, ["--slots", "65"]),
    ("draftMax", {f"{P}draftModel": DRAFT, f"{P}draftMax": 0}, ["--draft-max", "0"]),
    ("llamaCppCommit", {f"{P}llamaCppCommit": "0c1e570"}, ["--commit", "0c1e570"]),
    ("serverArgs", {f"{P}serverArgs": ["--port", "9"]}, ["--server-arg=--port", "--server-arg=9"]),
    ("serverArgs", {f"{P}serverArgs": ["--temp", "9"]}, ["--server-arg=--temp", "--server-arg=9"]),
    ("llamaCppPatchesOff", {f"{P}llamaCppPatchesOff": ["0009"]}, ["--patches-off", "0009"]),
]


@pytest.mark.parametrize(("key", "overrides", "args"), SAME_REFUSALS)
def test_a_flag_refuses_what_its_stack_setting_refuses_and_says_the_same(
    capsys, tmp_path: Path, key: str, overrides: dict[str, Any], args: list[str]
) -> None:
    """The stack's config check and `lrc local up` refuse the same values with the same words,
    each naming its own key: the setting, or the flag."""
    stack = refusal("aws-c8g", overrides)
    assert stack.setting == key, stack
    err = up_refuses(capsys, tmp_path, *args)
    assert f"error: {SETTING_FLAGS[key]}: {stack.message}" in err


def test_a_guard_below_a_stacks_least_is_for_trying_it_out(tmp_path: Path, model: Path) -> None:
    """A stack refuses a guard of less than 5 minutes idle or an hour; the local cluster takes
    fractions (a guard tried out in seconds), up to the stack's most."""
    refusal("aws-small", {"llama-rpc-cluster:stopAfterIdleMinutes": 1})
    options = UpOptions(workers=1, model=model, source=tmp_path, cache=tmp_path / "c",
                        machines=True, stop_after_idle_minutes=0.1,
                        stop_after_hours=0.01)  # fmt: skip
    assert validate(options).prefixlen == 24  # accepted: the cluster's network


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
    assert code == 2 and "--context: 0 is outside" in err  # still checked, after the note
    assert "note: machines need network namespaces: the nodes run as processes" in err


def test_an_unknown_delivery_is_refused_with_the_clouds_named(capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["up", "--machines", "--delivery", "aws,oracle", "--cache", str(tmp_path)])
    assert exit_.value.code == 2
    assert "--delivery: 'aws,oracle': give clouds from aws, gcp, azure" in capsys.readouterr().err


def test_a_patch_turned_off_reaches_every_nodes_settings(tmp_path: Path, model: Path) -> None:
    """--patches-off sets each named patch's switch for every node (llama.cpp reads it at run
    time: no rebuild); the others keep theirs unset."""
    options = UpOptions(workers=2, model=model, source=tmp_path, cache=tmp_path / "c",
                        patches_off=("0002", "0004"))  # fmt: skip
    for role in ("main", "worker"):
        env = boot_env(options, role)
        assert env["LLAMA_LOAD_PARALLEL"] == env["GGML_RPC_INFLIGHT_MB"] == "0"
        assert env["GGML_REPACK_THREADS"] == "1"
        assert "GGML_RPC_SKIP_HASH" not in env and "LLAMA_MMAP_POPULATE" not in env


@pytest.mark.parametrize(
    ("idle_minutes", "hours", "interval"),
    [(0.1, 0, "1"), (0, 0.01, "3"), (1, 0.01, "3"), (60, 8, "30")],
)
def test_a_spend_guard_looks_often_enough_for_its_shortest_limit(
    tmp_path: Path, model: Path, idle_minutes: float, hours: float, interval: str
) -> None:
    """A tenth of the shortest limit, from 1 s up to a VM's 30 s: 6 s idle is looked at every
    second, 36 s after boot every 3 s, an hour's limits as on a VM."""
    options = UpOptions(workers=1, model=model, source=tmp_path, cache=tmp_path / "c",
                        machines=True, stop_after_idle_minutes=idle_minutes,
                        stop_after_hours=hours)  # fmt: skip
    for role in ("main", "worker"):
        env = boot_env(options, role)
        assert env["STOP_AFTER_IDLE_SECONDS"] == str(round(idle_minutes * 60))
        assert env["STOP_AFTER_SECONDS"] == str(round(hours * 3600))
        assert env["GUARD_INTERVAL_SECONDS"] == interval, (role, env)


def test_a_staged_cluster_points_every_node_at_its_store(tmp_path: Path, model: Path) -> None:
    """--staged: the parts and the slice manifest where `lrc stage` puts them in the cluster's
    store (.4 of the private subnet), which each node reads with the store's endpoint."""
    options = UpOptions(workers=2, model=model, source=tmp_path, cache=tmp_path / "c",
                        machines=True, worker_local=True, staged=True)  # fmt: skip
    cidr = ipaddress.IPv4Network("10.0.0.0/24")
    ips = ["10.0.0.10", "10.0.0.11", "10.0.0.12"]
    group = serving_group(options, ips, cidr, plan_placement(options), on_machine=True)
    main_env, *worker_envs = (boot.env() for boot in group_boots(group))
    assert main_env["MODEL_URLS"] == "s3://models/local/m.gguf"
    for env in (main_env, *worker_envs):
        assert env["SLICE_MANIFEST"] == "s3://models/local/m.gguf.slices.json"
        assert env["MODEL_STORE_ENDPOINT"] == "http://10.0.0.4:9000"
        assert env["MODEL_STORE_REGION"] == "us-east-1"
    assert [env["SLICE_SOURCES"] for env in worker_envs] == ["s3://models/local/m.gguf"] * 2
    # Without --staged, a machine reads the host's copy at its mount.
    plain = serving_group(dataclasses.replace(options, staged=False), ips, cidr,
                          plan_placement(options), on_machine=True)  # fmt: skip
    assert plain.model_urls == ("file:///srv/models/m.gguf",) and not plain.model_store_endpoint


def test_user_data_over_its_clouds_limit_names_the_delivery_to_change(
    tmp_path: Path, model: Path, monkeypatch
) -> None:
    """A node whose user data its cloud cannot take (here AWS's limit made 2,000 bytes) is
    refused naming --delivery and the clouds that can take it, before the machine is made."""
    # deliver() reads the limits from the clouds' facts.
    small = dataclasses.replace(FACTS["aws"].user_data, limit_bytes=2000)
    monkeypatch.setitem(FACTS, "aws", dataclasses.replace(FACTS["aws"], user_data=small))
    options = UpOptions(workers=1, model=model, source=tmp_path, cache=tmp_path / "c",
                        machines=True, cluster_id="t")  # fmt: skip
    cidr = ipaddress.IPv4Network(options.cidr)
    slots = node_layout(cidr, 1)
    boots = node_boots(options, slots, cidr, plan_placement(options), state=tmp_path,
                       on_machine=True, keyed=False)  # fmt: skip
    network = VpcNetwork("t", cidr, tuple(s.name for s in slots), tuple(s.ip for s in slots))
    with pytest.raises(OptionError) as refused:
        machine_node(options, "w1", image_root=tmp_path, network=network, boot=boots[1], index=1)
    assert re.fullmatch(
        r"--delivery aws: node w1's aws user data is [\d,]+ bytes, over the 2,000-byte limit "
        r"even compressed; give its place in --delivery another cloud's \(gcp or azure\), "
        r"e\.g\. --delivery aws,gcp,azure",
        str(refused.value),
    ), refused.value
    assert not (state_dir(options.cache, "t") / "nodes" / "w1" / "user-data").exists()

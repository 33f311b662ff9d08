"""Rendering the nodes' cloud-config: schema-valid, complete, and delivered within each limit."""

from __future__ import annotations

import base64
import gzip
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra import boot
from infra.boot import BootConfigError, NodeBoot
from infra.local.supervisor import parse_unit
from tests.conftest import REPO, SCRIPTS, assert_valid_cloud_config, require_tool

MAIN = boot.example("main")
WORKER = boot.example("worker")


def files_of(node: NodeBoot) -> dict[str, dict[str, str]]:
    config = yaml.safe_load(boot.render(node))
    return {f["path"]: f for f in config["write_files"]}


def env_of(node: NodeBoot) -> dict[str, str]:
    content = files_of(node)[boot.VM_PATHS.env_file]["content"]
    pairs = (line.split("=", 1) for line in content.splitlines())
    return {k: v.strip("'") for k, v in pairs}


@pytest.mark.parametrize("node", [MAIN, WORKER], ids=["main", "worker"])
def test_rendered_config_passes_cloud_init_schema(node: NodeBoot, tmp_path: Path) -> None:
    assert_valid_cloud_config(boot.render(node), tmp_path)


def test_schema_check_catches_a_broken_config(tmp_path: Path) -> None:
    # The check above can fail: a malformed write_files entry is rejected.
    cloud_init = require_tool("cloud-init")
    config = boot.cloud_config(WORKER)
    config["write_files"][0]["permissions"] = 755
    config["write_files"][0]["mode"] = "0755"
    path = tmp_path / "bad.yaml"
    path.write_text("#cloud-config\n" + yaml.safe_dump(config))
    result = subprocess.run([cloud_init, "schema", "-c", str(path)], capture_output=True, text=True)
    assert result.returncode != 0


def test_boot_scripts_pass_shellcheck() -> None:
    shellcheck = require_tool("shellcheck")
    scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
    scripts += [str(p) for p in (REPO / "scripts").iterdir()] + [str(REPO / ".ci" / "run")]
    result = subprocess.run(
        [shellcheck, "-x", *scripts], capture_output=True, text=True, cwd=SCRIPTS
    )
    assert result.returncode == 0, result.stdout


def test_every_script_and_the_role_unit_are_installed() -> None:
    for node in (MAIN, WORKER):
        files = files_of(node)
        for script in SCRIPTS.iterdir():
            entry = files[f"{boot.VM_PATHS.bin_dir}/{script.name}"]
            assert entry["content"] == script.read_text()
        unit = boot.ROLE_UNIT[node.role]
        assert f"/etc/systemd/system/{unit}" in files
        other = boot.ROLE_UNIT["main" if node.role == "worker" else "worker"]
        assert f"/etc/systemd/system/{other}" not in files
        config = yaml.safe_load(boot.render(node))
        assert config["runcmd"] == [
            [
                "sh",
                "-c",
                f"{boot.VM_PATHS.bin_dir}/node-boot.sh && systemctl daemon-reload "
                f"&& systemctl enable --now {unit}",
            ]
        ]


def test_worker_binds_its_own_ip_and_admits_only_the_main_node() -> None:
    env = env_of(WORKER)
    assert env["LLAMA_ROLE"] == "worker"
    assert env["LLAMA_NODE_IP"] == "10.0.1.11"
    assert env["RPC_ALLOWED_SOURCES"] == "10.0.1.10/32"
    assert env["RPC_PORT"] == "50052"
    assert "RPC_WORKERS" not in env
    assert "nftables" in yaml.safe_load(boot.render(WORKER))["packages"]


def test_main_lists_exactly_the_workers_in_order() -> None:
    node = NodeBoot(
        role="main",
        node_ip="10.0.1.10",
        rpc_workers=("10.0.1.13", "10.0.1.11", "10.0.1.12"),
        model_urls=(
            "https://example.org/m-00001-of-00002.gguf",
            "https://example.org/m-00002-of-00002.gguf",
        ),
        model_sha256=("a" * 64, "b" * 64),
        gpu_layers=21,
        tensor_split=(7, 7, 7),
        context_size=8192,
        slots=2,
    )
    env = env_of(node)
    assert env["RPC_WORKERS"] == "10.0.1.13:50052,10.0.1.11:50052,10.0.1.12:50052"
    assert (env["LLAMA_GPU_LAYERS"], env["LLAMA_TENSOR_SPLIT"]) == ("21", "7,7,7")
    assert (env["CONTEXT_SIZE"], env["SLOTS"]) == ("8192", "2")
    assert env["MODEL_URLS"].split() == list(node.model_urls)
    assert env["MODEL_SHA256"].split() == ["a" * 64, "b" * 64]
    assert env["LLAMA_CPP_COMMIT"] == boot.LLAMA_CPP_COMMIT
    assert env["LLAMA_CPP_SOURCE"] == "https://github.com/ggml-org/llama.cpp"


def test_units_restart_and_start_at_boot() -> None:
    worker = parse_unit(boot.UNITS_DIR / "llama-rpc-worker.service")
    assert worker.start == "/opt/llama-rpc/bin/rpc-worker.sh"
    assert worker.pre == (("/opt/llama-rpc/bin/rpc-firewall.sh", True),)
    main = parse_unit(boot.UNITS_DIR / "llama-server.service")
    assert main.start == "/opt/llama-rpc/bin/llama-server.sh"
    for unit in (worker, main):
        assert unit.restart == "always"
        assert unit.restart_sec > 0
        text = (boot.UNITS_DIR / unit.name).read_text()
        assert "WantedBy=multi-user.target" in text
        assert "User=llama" in text


def test_data_disk_is_formatted_and_mounted_by_label() -> None:
    node = NodeBoot(
        role="worker",
        node_ip="10.0.1.11",
        rpc_allowed_sources=("10.0.1.10/32",),
        data_device="/dev/nvme1n1",
    )
    config = boot.cloud_config(node)
    assert config["fs_setup"][0]["device"] == "/dev/nvme1n1"
    assert config["mounts"][0][:2] == ["LABEL=llama-data", "/var/lib/llama-rpc"]


def test_rendering_is_deterministic() -> None:
    assert boot.render(MAIN) == boot.render(MAIN)
    first = boot.deliver(boot.render(MAIN), "aws")
    assert first == boot.deliver(boot.render(MAIN), "aws")


@pytest.mark.parametrize("cloud", boot.CLOUDS)
def test_delivery_round_trips_within_the_limit(cloud: boot.Cloud) -> None:
    user_data = boot.render(MAIN)
    delivery = boot.deliver(user_data, cloud)
    assert delivery.size <= boot.USER_DATA_LIMITS[cloud]
    if cloud == "azure":
        raw = base64.b64decode(delivery.value)
        assert delivery.field == "custom_data"
        assert len(delivery.value) == delivery.size
    elif delivery.gzipped:
        raw = base64.b64decode(delivery.value)
        assert delivery.field == "user_data_base64"
    else:
        raw = delivery.value.encode()
    text = gzip.decompress(raw).decode() if delivery.gzipped else raw.decode()
    assert text == user_data
    assert text.startswith("#cloud-config\n")


def test_aws_user_data_is_compressed_only_when_needed() -> None:
    small = "#cloud-config\nruncmd: [[true]]\n"
    assert boot.deliver(small, "aws").field == "user_data"
    assert boot.deliver(boot.render(MAIN), "aws").gzipped  # the scripts exceed 16 KB raw


def test_user_data_over_every_limit_is_refused() -> None:
    import os

    noise = base64.b64encode(os.urandom(300_000)).decode()  # does not compress
    for cloud in boot.CLOUDS:
        with pytest.raises(BootConfigError, match=f"the {cloud} user data"):
            boot.deliver("#cloud-config\n# " + noise, cloud)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_urls": ()}, "model_urls is empty"),
        ({"llama_cpp_commit": "master"}, "not a full 40-character commit"),
        ({"llama_cpp_commit": "0c1e570"}, "not a full 40-character commit"),
        ({"node_ip": "0.0.0.0"}, "node_ip '0.0.0.0' must be a private address"),
        ({"node_ip": "8.8.8.8"}, "must be a private address"),
        ({"rpc_workers": ("10.0.1.11", "10.0.1.11")}, "lists an address twice"),
        ({"model_sha256": ("a" * 64, "b" * 64)}, "2 checksums for 1 model URLs"),
        ({"model_sha256": ("XYZ",)}, "not a 64-character lowercase hex"),
        ({"model_urls": ("ftp://host/model.gguf",)}, "not an http"),
        ({"server_port": 70000}, "server_port 70000 is outside 1-65535"),
        ({"extra_env": {"X": "it's"}}, "quotes, backslashes and line breaks"),
        ({"tensor_split": ()}, r"tensor_split \(\) and gpu_layers 9 do not place layers on 1"),
        ({"tensor_split": (4, 5)}, "do not place layers on 1 workers"),
        ({"gpu_layers": 10}, "do not place layers"),
        ({"slots": 0}, "context_size, slots and worker_wait_seconds must be positive"),
    ],
)
def test_bad_main_settings_are_refused(changes: dict, message: str) -> None:
    settings = {
        "role": "main",
        "node_ip": "10.0.1.10",
        "rpc_workers": ("10.0.1.11",),
        "model_urls": ("https://example.org/model.gguf",),
        "gpu_layers": 9,
        "tensor_split": (9,),
        **changes,
    }
    with pytest.raises(BootConfigError, match=message):
        boot.render(NodeBoot(**settings))


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ((), "rpc_allowed_sources is empty"),
        (("0.0.0.0/0",), "not a private network"),
        (("52.0.0.0/16",), "not a private network"),
        (("10.0.1.999/32",), "not an address or CIDR"),
    ],
)
def test_a_worker_never_opens_rpc_beyond_the_cluster(sources: tuple, message: str) -> None:
    with pytest.raises(BootConfigError, match=message):
        NodeBoot(role="worker", node_ip="10.0.1.11", rpc_allowed_sources=sources)


@pytest.mark.parametrize("role", boot.ROLES)
def test_cli_prints_a_cloud_config(role: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "infra.boot", "--role", role, "--cloud", "aws"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    assert result.stdout.startswith("#cloud-config\n")
    assert "aws: user_data_base64, gzip" in result.stderr
    encoded = subprocess.run(
        [sys.executable, "-m", "infra.boot", "--role", role, "--cloud", "azure", "--encoded"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    assert base64.b64decode(encoded.stdout).decode() == result.stdout

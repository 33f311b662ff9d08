"""Rendering the nodes' cloud-config: schema-valid, complete, and delivered within each limit."""

from __future__ import annotations

import ast
import base64
import gzip
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading
import tokenize
from pathlib import Path

import pytest
import yaml

from infra import boot
from infra.boot import BootConfigError, NodeBoot
from infra.boot.installed import installed_text
from infra.clouds import FACTS
from infra.local import supervisor
from infra.local.supervisor import parse_unit
from infra.pins import LLAMA_CPP_COMMIT
from infra.types import ROLES, Cloud
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


def test_each_role_gets_every_script_it_runs_and_no_other() -> None:
    """Scripts call each other through the bin directory, and units name them: every name a
    role's scripts and units refer to is installed on that role's nodes."""
    used = set()
    for node in (MAIN, WORKER):
        files = files_of(node)
        installed = {
            path.rsplit("/", 1)[1]: entry["content"]
            for path, entry in files.items()
            if path.startswith(f"{boot.VM_PATHS.bin_dir}/")
        }
        assert set(installed) == set(boot.ROLE_SCRIPTS[node.role])
        for name, content in installed.items():
            assert content == installed_text(SCRIPTS / name)
        units = [files[f"/etc/systemd/system/{n}"]["content"] for n in (boot.BOOT_UNIT,
                 boot.ROLE_UNIT[node.role])]  # fmt: skip
        called = set()
        for text in [*installed.values(), *units]:
            called |= set(
                re.findall(r"(?:BIN_DIR|/opt/llama-rpc/bin)/([a-z][a-z-]*(?:\.sh)?)", text)
            )
        if node.role == "worker":
            called.discard("fetch-model.sh")  # node-boot.sh runs it on the main node only
        assert called <= set(installed), f"{node.role}: {called - set(installed)} missing"
        used |= set(installed)
    assert used == {p.name for p in SCRIPTS.iterdir()}, "a script no role runs"


def test_the_boot_unit_and_the_role_unit_are_installed() -> None:
    for node in (MAIN, WORKER):
        files = files_of(node)
        unit = boot.ROLE_UNIT[node.role]
        for name in (boot.BOOT_UNIT, unit):
            assert files[f"/etc/systemd/system/{name}"]["content"] == (
                installed_text(boot.UNITS_DIR / name)
            )
        other = boot.ROLE_UNIT["main" if node.role == "worker" else "worker"]
        assert f"/etc/systemd/system/{other}" not in files


def test_cloud_init_only_starts_the_units() -> None:
    """The boot runs under systemd (which retries it), not once from runcmd; --no-block, as
    runcmd runs inside cloud-final.service and must not wait for a boot of hours."""
    for node in (MAIN, WORKER):
        config = yaml.safe_load(boot.render(node))
        assert config["runcmd"] == [
            ["systemctl", "daemon-reload"],
            [
                "systemctl",
                "enable",
                "--now",
                "--no-block",
                boot.BOOT_UNIT,
                boot.ROLE_UNIT[node.role],
            ],
        ]
        assert "node-boot.sh" not in str(config["runcmd"])


def test_apt_retries_its_downloads() -> None:
    for node in (MAIN, WORKER):
        config = boot.cloud_config(node)
        assert config["apt"] == {"conf": 'Acquire::Retries "5";\n'}
        # ... and the boot installs what cloud-init's `packages` could not.
        assert env_of(node)["LLAMA_PACKAGES"].split() == config["packages"]


def test_the_node_settings_are_roots_alone() -> None:
    """node.env (which may hold a model URL's token) is 0600 root: systemd reads it as root;
    the services, run as the service user, get their settings from systemd and lib.sh sources
    the file only when it can read it."""
    for node in (MAIN, WORKER):
        entry = files_of(node)[boot.VM_PATHS.env_file]
        assert (entry["permissions"], entry["owner"]) == ("0600", "root:root")
    assert '[[ -r "$LLAMA_RPC_ENV_FILE" ]]' in (SCRIPTS / "lib.sh").read_text()
    for name in boot.ROLE_UNIT.values():
        text = (boot.UNITS_DIR / name).read_text()
        assert "User=llama" in text and "EnvironmentFile=/etc/llama-rpc/node.env" in text


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
    assert env["LLAMA_CPP_COMMIT"] == LLAMA_CPP_COMMIT
    assert env["LLAMA_CPP_SOURCE"] == "https://github.com/ggml-org/llama.cpp"


def unit_text(name: str) -> str:
    return (boot.UNITS_DIR / name).read_text()


def test_the_boot_is_a_unit_that_retries_until_it_succeeds() -> None:
    unit = parse_unit(boot.UNITS_DIR / boot.BOOT_UNIT)
    text = unit_text(boot.BOOT_UNIT)
    assert unit.type == "oneshot" and "RemainAfterExit=yes" in text
    assert unit.start == "/opt/llama-rpc/bin/node-boot.sh"
    assert "User=" not in text  # root: it installs packages and owns the build prefix
    assert unit.restart == "on-failure"
    assert "StartLimitIntervalSec=0" in text  # never gives up
    delays = [unit.restart_delay(n) for n in range(1, 12)]
    assert delays[0] == 10
    assert all(a < b for a, b in itertools.pairwise(delays[:7]))  # growing ...
    assert 300 <= max(delays) <= 900  # ... to minutes, not hours
    assert "systemd >= 254" in text and "24.04 ships 255" in text
    # Without RestartMode=direct the role unit's start job fails at the first failure and
    # nothing starts the role once a retry succeeds.
    assert "RestartMode=direct" in text
    # What a retry cannot mend (node-boot.sh exits 78) is not retried.
    assert unit.restart_prevent_exit_status == (78,)
    assert not unit.restarts_after(78) and unit.restarts_after(1) and not unit.restarts_after(0)
    assert "WantedBy=multi-user.target" in text


def test_each_role_unit_starts_after_a_successful_boot_and_restarts_ever_slower() -> None:
    worker = parse_unit(boot.UNITS_DIR / "llama-rpc-worker.service")
    assert worker.start == "/opt/llama-rpc/bin/rpc-worker.sh"
    assert worker.pre == (("/opt/llama-rpc/bin/rpc-firewall.sh", True),)
    main = parse_unit(boot.UNITS_DIR / "llama-server.service")
    assert main.start == "/opt/llama-rpc/bin/llama-server.sh"
    for unit in (worker, main):
        assert boot.BOOT_UNIT in unit.requires and boot.BOOT_UNIT in unit.after
        assert unit.restart == "always"
        delays = [unit.restart_delay(n) for n in range(1, 10)]
        assert delays[0] == 5 and delays[1] > 5
        assert 120 <= max(delays) <= 600  # a few minutes, not every 5 s for ever
        text = unit_text(unit.name)
        assert "WantedBy=multi-user.target" in text
        assert "User=llama" in text


def test_no_unit_holds_up_multi_user_target() -> None:
    """A target orders itself after the units it wants unless they say DefaultDependencies=no:
    multi-user.target (and cloud-final.service after it) would wait through every retry of the
    boot. The units keep the other default dependencies."""
    for name in (boot.BOOT_UNIT, *boot.ROLE_UNIT.values()):
        unit = parse_unit(boot.UNITS_DIR / name)
        assert "DefaultDependencies=no" in unit_text(name)
        assert "sysinit.target" in unit.requires
        assert {"sysinit.target", "basic.target"} <= set(unit.after)
        assert "Conflicts=shutdown.target" in unit_text(name)


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    """systemd-analyze verify, in a root holding the units, their commands and systemd's own
    units. (This machine's systemd may predate 254: it may only not know the newer keys.)"""
    analyze = require_tool("systemd-analyze")
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/llama-rpc").mkdir(parents=True)
    (root / "etc/llama-rpc/node.env").write_text(boot.render_env_file(MAIN.env()))
    for script in SCRIPTS.iterdir():
        target = root / "opt/llama-rpc/bin" / script.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(script, target)
        target.chmod(0o755)
    names = (boot.BOOT_UNIT, *boot.ROLE_UNIT.values())
    for name in names:
        target = root / "etc/systemd/system" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(boot.UNITS_DIR / name, target)
    units = [f"/etc/systemd/system/{name}" for name in names]
    result = subprocess.run(
        [analyze, "verify", "--man=no", f"--root={root}", *units], capture_output=True, text=True
    )
    version = int(re.search(r"systemd (\d+)", subprocess.run(
        [analyze, "--version"], capture_output=True, text=True).stdout)[1])  # fmt: skip
    newer = "RestartSteps|RestartMaxDelaySec|RestartMode"
    allowed = re.compile(rf".*: Unknown key '({newer})' in section \[Service\], ignoring\.")
    complaints = [
        line for line in result.stderr.splitlines()
        if not (version < 254 and allowed.fullmatch(line))
    ]  # fmt: skip
    assert result.returncode == 0 and not complaints, result.stderr


def test_the_local_supervisor_retries_the_boot_then_starts_the_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local cluster's stand-in for systemd follows the same units: the role starts only once
    the boot succeeded, after its retries; a boot that exits 78 is not retried."""
    log = tmp_path / "ran"
    boot_script = tmp_path / "boot.sh"
    # Fails twice, then succeeds; or exits 78 when told to.
    boot_script.write_text(
        f"echo boot >>{log}\n[[ -f {tmp_path}/final ]] && exit 78\n"
        f"[[ $(grep -c boot {log}) -ge 3 ]]\n"
    )
    role_script = tmp_path / "role.sh"
    role_script.write_text(f"echo role >>{log}\n")
    units = tmp_path / "units"
    units.mkdir()
    (units / boot.BOOT_UNIT).write_text(
        unit_text(boot.BOOT_UNIT)
        .replace("/opt/llama-rpc/bin/node-boot.sh", str(boot_script))
        .replace("RestartSec=10s", "RestartSec=50ms")
        .replace("RestartMaxDelaySec=10min", "RestartMaxDelaySec=200ms")
    )
    (units / "llama-rpc-worker.service").write_text(
        "[Service]\nType=simple\nExecStart=" + str(role_script) + "\nRestart=no\n"
    )
    monkeypatch.setattr(supervisor, "UNITS_DIR", units)

    def run_node() -> list[str]:
        log.unlink(missing_ok=True)
        with (tmp_path / "node.log").open("w") as out:
            node = supervisor.NodeProcess(
                name="w1", role="worker", namespace=None, env_file=tmp_path / "node.env",
                log=out, privileged=False,
            )  # fmt: skip
            thread = threading.Thread(target=node.run)
            thread.start()
            thread.join(30)
            assert not thread.is_alive()
        return log.read_text().split()

    assert run_node() == ["boot", "boot", "boot", "role"]
    (tmp_path / "final").touch()
    assert run_node() == ["boot"]
    assert "exited with status 78; not restarting" in (tmp_path / "node.log").read_text()


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


# Prints the main node's AWS user data as delivered (gzipped: it is over AWS's 16 KiB).
DELIVER_MAIN = (
    "import sys; from infra import boot; "
    "sys.stdout.write(boot.deliver(boot.render(boot.example('main')), 'aws').value)"
)


def test_delivered_bytes_depend_on_the_config_alone() -> None:
    """A node is replaced when its user data changes, so the same config must give the same
    bytes in every later run: no timestamp in the gzip header, nothing that follows the process
    (hash seed) or the time zone."""
    assert boot.render(MAIN) == boot.render(MAIN)
    delivery = boot.deliver(boot.render(MAIN), "aws")
    assert delivery.gzipped
    header = base64.b64decode(delivery.value)[:10]
    assert header[:3] == b"\x1f\x8b\x08"  # gzip, deflate
    assert header[4:8] == b"\0\0\0\0", "the gzip MTIME field must be unset"
    runs = []
    for seed, tz in (("1", "UTC"), ("2", "Pacific/Kiritimati")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "TZ": tz}
        result = subprocess.run(
            [sys.executable, "-c", DELIVER_MAIN], env=env, cwd=REPO, capture_output=True,
            text=True, check=True,
        )  # fmt: skip
        runs.append(result.stdout)
    assert runs == [delivery.value, delivery.value]


@pytest.mark.parametrize("cloud", sorted(FACTS))
def test_delivery_round_trips_within_the_limit(cloud: Cloud) -> None:
    user_data = boot.render(MAIN)
    delivery = boot.deliver(user_data, cloud)
    assert delivery.size <= FACTS[cloud].user_data.limit_bytes
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


def test_azure_takes_the_user_data_uncompressed() -> None:
    """The boot scripts stay small enough for Azure's 65,535 base64 bytes without gzip (the
    Azure stack's tests read customData as plain text)."""
    for node in (MAIN, WORKER):
        assert not boot.deliver(boot.render(node), "azure").gzipped


def test_aws_user_data_is_compressed_only_when_needed() -> None:
    small = "#cloud-config\nruncmd: [[true]]\n"
    assert boot.deliver(small, "aws").field == "user_data"
    assert boot.deliver(boot.render(MAIN), "aws").gzipped  # the scripts exceed 16 KB raw


def test_user_data_over_every_limit_is_refused() -> None:
    noise = base64.b64encode(os.urandom(300_000)).decode()  # does not compress
    for cloud in sorted(FACTS):
        with pytest.raises(BootConfigError, match=f"the {cloud} user data") as refused:
            boot.deliver("#cloud-config\n# " + noise, cloud)
        assert refused.value.setting == "user_data"
    with pytest.raises(BootConfigError, match="cloud 'ibm' is not one of") as refused:
        boot.deliver("#cloud-config\n", "ibm")  # type: ignore[arg-type]
    assert refused.value.setting == "cloud"


@pytest.mark.parametrize(
    ("changes", "setting", "message"),
    [
        ({"model_urls": ()}, "model_urls", "model_urls is empty"),
        ({"llama_cpp_commit": "master"}, "llama_cpp_commit", "not a full 40-character commit"),
        ({"llama_cpp_commit": "0c1e570"}, "llama_cpp_commit", "not a full 40-character commit"),
        ({"node_ip": "0.0.0.0"}, "node_ip", "node_ip '0.0.0.0' must be a private address"),
        ({"node_ip": "8.8.8.8"}, "node_ip", "must be a private address"),
        ({"rpc_workers": ("10.0.1.11", "10.0.1.11")}, "rpc_workers", "lists an address twice"),
        ({"rpc_workers": ("example",)}, "rpc_workers", "'example' is not an IP address"),
        ({"model_sha256": ("a" * 64, "b" * 64)}, "model_sha256", "2 checksums for 1 model URLs"),
        ({"model_sha256": ("XYZ",)}, "model_sha256", "not a 64-character lowercase hex"),
        ({"model_urls": ("ftp://host/model.gguf",)}, "model_urls", "not an http"),
        ({"server_port": 70000}, "server_port", "server_port 70000 is outside 1-65535"),
        ({"rpc_port": 0}, "rpc_port", "rpc_port 0 is outside 1-65535"),
        ({"extra_env": {"X": "it's"}}, "extra_env", "quotes, backslashes and line breaks"),
        ({"llama_cpp_source": "/src/it's"}, "llama_cpp_source", "quotes, backslashes"),
        ({"model_urls": ("https://h/it's.gguf",)}, "model_urls", "quotes, backslashes"),
        ({"tensor_split": ()}, "tensor_split", r"tensor_split \(\) and gpu_layers 9 do not place"),
        ({"tensor_split": (4, 5)}, "tensor_split", "do not place layers on 1 workers"),
        ({"gpu_layers": 10}, "tensor_split", "do not place layers"),
        ({"slots": 0}, "slots", "slots 0 must be at least 1"),
        ({"context_size": -1}, "context_size", "context_size -1 must be at least 1"),
        ({"worker_wait_seconds": 0}, "worker_wait_seconds", "worker_wait_seconds 0 must be"),
        ({"load_timeout_seconds": 0}, "load_timeout_seconds", "load_timeout_seconds 0 must be"),
        (
            {"model_urls": ("https://h/models/",)},
            "model_urls",
            "model URL 'https://h/models/' does not end in a file name; give the URL of the GGUF",
        ),
        (
            {"model_urls": ("https://h/x/?download=1",)},
            "model_urls",
            "does not end in a file name",
        ),
        (
            {"model_urls": ("https://h/a/m.gguf", "https://h/b/m.gguf?x=1")},
            "model_urls",
            "model URLs 'https://h/a/m.gguf' and 'https://h/b/m.gguf\\?x=1' both save as 'm.gguf'",
        ),
    ],
)
def test_bad_main_settings_are_refused(changes: dict, setting: str, message: str) -> None:
    settings = {
        "role": "main",
        "node_ip": "10.0.1.10",
        "rpc_workers": ("10.0.1.11",),
        "model_urls": ("https://example.org/model.gguf",),
        "gpu_layers": 9,
        "tensor_split": (9,),
        **changes,
    }
    with pytest.raises(BootConfigError, match=message) as refused:
        boot.render(NodeBoot(**settings))
    assert refused.value.setting == setting


def test_the_main_node_gets_its_load_deadline() -> None:
    assert env_of(MAIN)["LOAD_TIMEOUT_SECONDS"] == "3600"
    node = NodeBoot(**{**MAIN.__dict__, "load_timeout_seconds": 7200})
    assert env_of(node)["LOAD_TIMEOUT_SECONDS"] == "7200"


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
    with pytest.raises(BootConfigError, match=message) as refused:
        NodeBoot(role="worker", node_ip="10.0.1.11", rpc_allowed_sources=sources)
    assert refused.value.setting == "rpc_allowed_sources"


@pytest.mark.parametrize("role", ROLES)
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
    raw = base64.b64decode(encoded.stdout)
    if raw[:2] == b"\x1f\x8b":  # gzipped to fit (cloud-init unpacks it)
        raw = gzip.decompress(raw)
    assert raw.decode() == result.stdout


def _bash_reads(text: str) -> str:
    """The script as bash parses it: wrapped in a function, printed back by ``declare -f``
    (which drops comments and keeps every string and heredoc)."""
    result = subprocess.run(
        ["bash", "-c", 'eval "f() {\n$SCRIPT\n}" && declare -f f'],
        env={"SCRIPT": text, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return result.stdout


@pytest.mark.parametrize("path", sorted(SCRIPTS.iterdir()), ids=lambda p: p.name)
def test_a_node_gets_each_script_as_it_is_parsed_without_its_comments(path: Path) -> None:
    """Bash (or Python) reads the installed script exactly as it reads the repository's."""
    source, installed = path.read_text(), installed_text(path)
    assert installed.splitlines()[0] == source.splitlines()[0]  # the shebang
    assert len(installed) < len(source)
    if "python" in source.splitlines()[0]:
        assert ast.dump(ast.parse(installed)) == ast.dump(ast.parse(source))
        assert not [t for t in _python_tokens(installed) if t.type == tokenize.COMMENT][1:]
    else:
        assert _bash_reads(installed) == _bash_reads(source)
        assert not [ln for ln in installed.splitlines()[1:] if ln.lstrip().startswith("# ")]


def _python_tokens(text: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(text).readline))


@pytest.mark.parametrize("path", sorted(boot.UNITS_DIR.iterdir()), ids=lambda p: p.name)
def test_a_node_gets_each_unit_without_its_comments(path: Path) -> None:
    kept = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith(("#", ";"))]
    assert installed_text(path).splitlines() == kept


def test_a_staged_model_brings_rclone_and_the_stores_region() -> None:
    staged = NodeBoot(
        role="main", node_ip="10.0.1.10", model_urls=("s3://models/llama/model.gguf",),
        model_store_region="eu-west-1",
    )  # fmt: skip
    assert "rclone" in boot.cloud_config(staged)["packages"]
    assert staged.env()["MODEL_STORE_REGION"] == "eu-west-1"
    assert "MODEL_STORE_ENDPOINT" not in staged.env()
    plain = boot.example("main")
    assert "rclone" not in boot.cloud_config(plain)["packages"]
    assert "MODEL_STORE_REGION" not in plain.env()


@pytest.mark.parametrize("region", ["", "us east 1", "EU-WEST-1"])
def test_a_staged_model_needs_the_stores_region(region: str) -> None:
    with pytest.raises(BootConfigError) as refused:
        NodeBoot(
            role="main", node_ip="10.0.1.10", model_urls=("s3://models/model.gguf",),
            model_store_region=region,
        )  # fmt: skip
    assert refused.value.setting == "model_store_region"
    assert "give model_store_region, the store's region (for example us-east-1)" in str(
        refused.value
    )

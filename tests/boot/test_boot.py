"""Rendering the nodes' cloud-config: schema-valid, complete, and delivered within each limit."""

from __future__ import annotations

import ast
import base64
import dataclasses
import gzip
import io
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tokenize
from pathlib import Path, PurePosixPath

import pytest
import yaml

from infra import boot
from infra.boot import BootConfigError, NodeBoot
from infra.boot.deliver import for_cloud
from infra.boot.installed import installed_text
from infra.boot.patches import Patch, patch_set
from infra.clouds import FACTS
from infra.core.limits import METRICS_PORT, ROLES, Cloud
from infra.core.pins import LLAMA_CPP_COMMIT
from infra.local import image, supervisor
from infra.local.supervisor import parse_unit
from tests.conftest import (
    LRC,
    REPO,
    SCRIPTS,
    assert_valid_cloud_config,
    fake_llama_server,
    fake_main_node,
    free_port,
    require_tool,
    unavailable,
)

MAIN = boot.example("main")
WORKER = boot.example("worker")


def script_files() -> list[Path]:
    """The node scripts, without what Python may write beside them (``__pycache__``)."""
    return sorted(p for p in SCRIPTS.iterdir() if p.is_file())


# Every feature that brings scripts of its own: a staged model, a key read from the cloud's
# store, a spend guard that deallocates its node (Azure).
FULL_MAIN = dataclasses.replace(
    MAIN,
    model_urls=("s3://models/llama/model-Q4_0.gguf",),
    model_store_region="us-east-1",
    api_key_file=boot.VM_API_KEY_FILE,
    api_key_source="aws-ssm:us-east-1:/llama-rpc-cluster/dev/api-key",
    stop_after_idle_seconds=1800,
    stop_after_seconds=36000,
    stop_by="azure-deallocate",
)
GUARDED_WORKER = dataclasses.replace(WORKER, stop_after_idle_seconds=1800)
# Worker-local loading, from a staged model's slice manifest.
SLICE_MANIFEST = "s3://models/m/m.gguf.slices.json"
SLICED_MAIN = dataclasses.replace(
    MAIN, model_urls=("s3://models/m/m.gguf",), model_store_region="us-east-1",
    slice_manifest=SLICE_MANIFEST, slice_layers=27,
)  # fmt: skip
SLICED_WORKER = dataclasses.replace(
    WORKER, slice_manifest=SLICE_MANIFEST, slice_sources=("s3://models/m/m.gguf",),
    slice_first_layer=27, slice_layers=27, slice_output=1,
)  # fmt: skip
# A worker that fetches the prebuilt llama.cpp from its stack's store.
PREBUILT_WORKER = dataclasses.replace(
    WORKER,
    prebuilt_store="s3://lrc/nodes",
    prebuilt_target="aarch64-armv9-a_sve2_bf16_i8mm",
    model_store_region="us-east-1",
)
# The key read from the other clouds' stores.
GCP_KEYED_MAIN = dataclasses.replace(
    MAIN, api_key_file=boot.VM_API_KEY_FILE, api_key_source="gcp-sm:llama-rpc-cluster-dev-api-key"
)
AZURE_KEYED_MAIN = dataclasses.replace(
    MAIN, api_key_file=boot.VM_API_KEY_FILE, api_key_source="azure-kv:api-key"
)


def files_of(node: NodeBoot) -> dict[str, dict[str, str]]:
    config = yaml.safe_load(boot.render(node))
    return {f["path"]: f for f in config["write_files"]}


@pytest.mark.parametrize("node", [MAIN, GUARDED_WORKER], ids=["main", "worker"])
def test_a_node_gets_the_diffs_its_build_needs_and_the_hashes_of_the_rest(node: NodeBoot) -> None:
    """The text before a patch's diff is for readers: a node gets the diffs alone (an AWS worker
    carries every boot file in its 16 KB of user data), and of a patch that changes nothing its
    role builds only the diff's hash, which keeps the set's digest whole
    (test_the_scripts_and_the_program_agree_on_the_sets_digest)."""
    directory = f"{PurePosixPath(boot.VM_PATHS.bin_dir).parent}/patches/{LLAMA_CPP_COMMIT}/"
    shipped = {
        path.removeprefix(directory): entry["content"]
        for path, entry in files_of(node).items()
        if path.startswith(directory)
    }
    patches = patch_set(LLAMA_CPP_COMMIT)
    assert len(shipped) == len(patches)
    for patch in patches:
        text = patch.path.read_text()
        if node.role in patch.roles:
            assert "Switch:" in text and "Switch:" not in shipped[patch.name]
            assert shipped[patch.name] == patch.diff and text.endswith(shipped[patch.name])
        else:
            assert shipped[f"{patch.name}.sha256"] == f"{patch.diff_sha256}\n"
    withheld = {p.name for p in patches if node.role not in p.roles}
    # The loader's patches change llama-server alone, and 0002 and 0006 the RPC client alone
    # (their ``Roles: main``); a worker's build needs every other.
    main_only = {
        "0002-rpc-overlap-weight-sends.patch",
        "0003-mmap-no-populate-beyond-memory.patch",
        "0006-rpc-weights-by-key-from-worker-disk.patch",
        "0007-loader-worker-weights-stay-remote.patch",
    }
    assert withheld == (set() if node.role == "main" else main_only)


def test_each_diff_keeps_one_line_of_context() -> None:
    """Three lines of context would check nothing more at an exact pin, and cost an AWS worker
    about 1.3 KB of its 16 KB of user data (``git diff -U1`` makes them)."""
    for patch in patch_set(LLAMA_CPP_COMMIT):
        for hunk in re.split(r"^@@ .*\n", patch.diff, flags=re.M)[1:]:
            lines = [line for line in hunk.splitlines() if not line.startswith(("--- ", "+++ "))]
            changed = [i for i, line in enumerate(lines) if line[:1] in "+-"]
            assert changed, f"{patch.name}: a hunk that changes nothing"
            lead, trail = changed[0], len(lines) - 1 - changed[-1]
            assert lead <= 1 and trail <= 1, f"{patch.name}: a hunk with {max(lead, trail)} lines"


def _patch(tmp_path: Path, *files: str) -> Patch:
    path = tmp_path / "0001-x.patch"
    hunks = "".join(f"--- a/{f}\n+++ b/{f}\n@@ -1 +1 @@\n-a\n+b\n" for f in files)
    path.write_text(f"Why.\n\n{hunks}")
    return Patch(path, (), "none")


@pytest.mark.parametrize(
    ("files", "roles"),
    [
        (["src/llama-model-loader.cpp", "src/llama-model.cpp"], {"main"}),
        (["tools/server/server.cpp", "common/arg.cpp", "include/llama.h"], {"main"}),
        (["ggml/src/ggml-rpc/ggml-rpc.cpp"], {"main", "worker"}),
        (["tools/rpc/rpc-server.cpp"], {"main", "worker"}),
        (["src/llama.cpp", "ggml/src/ggml-cpu/repack.cpp"], {"main", "worker"}),
        (["CMakeLists.txt"], {"main", "worker"}),
    ],
)
def test_a_patch_goes_to_a_worker_unless_it_touches_only_what_main_alone_builds(
    tmp_path: Path, files: list[str], roles: set[str]
) -> None:
    patch = _patch(tmp_path, *files)
    assert patch.files == tuple(files)
    assert patch.roles == roles


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
    scripts = sorted(str(p) for p in script_files() if "bash" in p.read_text().split("\n", 1)[0])
    scripts += [str(p) for p in (REPO / "scripts").iterdir()] + [str(REPO / ".ci" / "run")]
    result = subprocess.run(
        [shellcheck, "-x", *scripts], capture_output=True, text=True, cwd=SCRIPTS
    )
    assert result.returncode == 0, result.stdout


def test_each_role_gets_every_script_it_runs_and_no_other() -> None:
    """Scripts call each other through the bin directory, and units name them: every name a
    role's scripts and units refer to is installed on that role's nodes."""
    used = set()
    nodes = (MAIN, WORKER, FULL_MAIN, GUARDED_WORKER, PREBUILT_WORKER, GCP_KEYED_MAIN,
             AZURE_KEYED_MAIN, SLICED_MAIN, SLICED_WORKER)  # fmt: skip
    for node in nodes:
        files = files_of(node)
        installed = {
            path.rsplit("/", 1)[1]: entry["content"]
            for path, entry in files.items()
            if path.startswith(f"{boot.VM_PATHS.bin_dir}/")
        }
        assert set(installed) == set(boot.node_scripts(node))
        for name, content in installed.items():
            assert content == installed_text(SCRIPTS / name)
        units = [files[f"/etc/systemd/system/{n}"]["content"] for n in boot.node_units(node)]
        called = set()
        for text in [*installed.values(), *units]:
            called |= set(
                re.findall(r"(?:BIN_DIR|/opt/llama-rpc/bin)/([a-z][a-z-]*(?:\.sh)?)", text)
            )
        if node.role == "worker":  # node-boot.sh runs these on the main node only
            called -= {"fetch-model.sh", "model-disk.sh", "llama-rpc-secret"}
        if not node.api_key_source:  # node-boot.sh runs it only with a key source
            called -= {"llama-rpc-secret"}
        if not node.prebuilt_store:  # build-llama.sh sources it only then
            called -= {"fetch-llama.sh"}
        if not node.staged:  # fetch-model.sh sources it only for a staged model
            called -= {"fetch-staged.sh"}
        if not node.slice_manifest:  # node-boot.sh runs it only with worker-local loading
            called -= {"fetch-slice.sh"}
        if not (node.staged or node.prebuilt_store or node.slices_from_store):
            called -= {"store-remote.sh"}  # what the store's readers source
        if node.stop_by != "azure-deallocate":  # the guard runs it only on Azure
            called -= {"llama-rpc-deallocate"}
        assert called <= set(installed), f"{node.role}: {called - set(installed)} missing"
        used |= set(installed)
    assert used == {p.name for p in script_files()}, "a script no role runs"


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
            # Restarted, not just started: an image with the package may have started the
            # exporter before cloud-init wrote its drop-in.
            ["systemctl", "enable", "prometheus-node-exporter.service"],
            ["systemctl", "restart", "--no-block", "prometheus-node-exporter.service"],
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
        # Not every 5 s for ever, nor so long that a group's heal after many lost workers
        # outlasts a minute (systemd counts restarts for the whole boot).
        assert max(delays) == 30
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
    for script in script_files():
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
    newer = "RestartSteps|RestartMaxDelaySec|RestartMode|ImportCredential"
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


def test_a_draft_model_reaches_the_main_nodes_boot_and_bad_ones_are_refused() -> None:
    url = "https://example.com/llama-3.1-8b-q4_0.gguf"
    main = dataclasses.replace(MAIN, draft_urls=(url,), draft_sha256=("a" * 64,), draft_max=6)
    env = main.env()
    assert (env["DRAFT_MODEL_URLS"], env["DRAFT_MODEL_SHA256"]) == (url, "a" * 64)
    assert (env["DRAFT_MAX"], env["DRAFT_MIN"], env["DRAFT_P_MIN"]) == ("6", "0", "0.75")
    assert not any(name.startswith("DRAFT_") for name in MAIN.env())
    for field, change in (
        ("draft_urls", {"role": "worker", "rpc_allowed_sources": ("10.0.1.10/32",)}),
        ("draft_sha256", {"draft_sha256": ("a" * 64, "b" * 64)}),
        ("draft_max", {"draft_max": 0}),
        ("draft_max", {"draft_min": 7}),
        ("draft_p_min", {"draft_p_min": 1.5}),
        ("draft_urls", {"draft_urls": (MAIN.model_urls[0],)}),  # saved over the model
    ):
        with pytest.raises(BootConfigError) as raised:
            dataclasses.replace(main, **change)
        assert raised.value.setting == field, (change, raised.value)


def test_a_guarded_node_says_how_often_its_guard_looks() -> None:
    """Every 30 s on a VM; the local cluster asks for less (limits of seconds, to try them)."""
    assert GUARDED_WORKER.env()["GUARD_INTERVAL_SECONDS"] == "30"
    assert "GUARD_INTERVAL_SECONDS" not in WORKER.env()
    often = dataclasses.replace(GUARDED_WORKER, guard_interval_seconds=1)
    assert often.env()["GUARD_INTERVAL_SECONDS"] == "1"
    with pytest.raises(BootConfigError) as refused:
        dataclasses.replace(GUARDED_WORKER, guard_interval_seconds=0)
    assert refused.value.setting == "guard_interval_seconds"


def test_a_model_disk_reaches_the_main_nodes_boot_and_is_refused_elsewhere() -> None:
    main = dataclasses.replace(
        MAIN, model_disk_gb=300, model_disk_model="Amazon Elastic Block Store"
    )
    env = main.env()
    assert env["MODEL_DISK_GB"] == "300"
    assert env["MODEL_DISK_MODEL"] == "Amazon Elastic Block Store"
    assert "MODEL_DISK_GB" not in MAIN.env()
    # cloud-init formats and mounts nothing: the volume is attached after the node starts.
    assert "fs_setup" not in boot.cloud_config(main) and "mounts" not in boot.cloud_config(main)
    with pytest.raises(BootConfigError, match="model_disk_gb"):
        dataclasses.replace(
            WORKER, model_disk_gb=300, model_disk_model="Amazon Elastic Block Store"
        )
    with pytest.raises(BootConfigError, match="model_disk_model"):
        dataclasses.replace(MAIN, model_disk_gb=300)


# Where the tests' AWS nodes read the boot files beyond their user data.
AWS_FILES = ("us-east-1", "/llama-rpc-cluster/t/boot/main")
# Prints the main node's AWS user data as delivered (gzipped: it is over AWS's 16 KiB).
DELIVER_MAIN = (
    "import sys; from infra import boot; from infra.boot.deliver import for_cloud; "
    f"node = for_cloud(boot.example('main'), 'aws', *{AWS_FILES!r}); "
    "sys.stdout.write(boot.deliver(boot.render(node), 'aws').value)"
)


def test_delivered_bytes_depend_on_the_config_alone() -> None:
    """A node is replaced when its user data changes, so the same config must give the same
    bytes in every later run: no timestamp in the gzip header, nothing that follows the process
    (hash seed) or the time zone."""
    main = for_cloud(MAIN, "aws", *AWS_FILES)
    assert boot.render(main) == boot.render(main)
    delivery = boot.deliver(boot.render(main), "aws")
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
    user_data = boot.render(for_cloud(MAIN, cloud, *AWS_FILES))
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


def test_azure_takes_the_user_data_plain_while_it_fits_and_gzipped_past_it() -> None:
    """customData is base64 of at most 65,535 bytes: user data goes plain while that holds it,
    gzipped past it (cloud-init unpacks it), well within the limit."""
    for node in (WORKER, MAIN):
        text = boot.render(node)
        delivered = boot.deliver(text, "azure")
        assert delivered.gzipped == (len(base64.b64encode(text.encode())) > 65_535)
        assert delivered.size <= 65_535
    larger = boot.render(MAIN) + "# " + "a long comment " * 5_000  # 75 KB, compressible
    delivered = boot.deliver(larger, "azure")
    assert delivered.gzipped and delivered.size < 65_535 // 2


def test_aws_user_data_is_compressed_only_when_needed() -> None:
    small = "#cloud-config\nruncmd: [[true]]\n"
    assert boot.deliver(small, "aws").field == "user_data"
    main = for_cloud(MAIN, "aws", *AWS_FILES)
    assert boot.deliver(boot.render(main), "aws").gzipped  # the scripts exceed 16 KB raw


def test_user_data_over_every_limit_is_refused() -> None:
    noise = base64.b64encode(os.urandom(300_000)).decode()  # does not compress
    for cloud in sorted(FACTS):
        with pytest.raises(BootConfigError, match=f"the {cloud} user data") as refused:
            boot.deliver("#cloud-config\n# " + noise, cloud)
        assert refused.value.setting == "user_data"  # the stack names what fills it
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
        [LRC, "boot", "--role", role, "--cloud", "aws"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    assert result.stdout.startswith("#cloud-config\n")
    assert "aws: user_data_base64, gzip" in result.stderr
    stored = f"LLAMA_RPC_FILES_SOURCE='aws-ssm:us-east-1:/llama-rpc-cluster/example/boot/{role}'"
    assert (stored in result.stdout) == (role == "main")  # a worker has no role to read it with
    whole = subprocess.run(
        [LRC, "boot", "--role", role],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout  # fmt: skip
    encoded = subprocess.run(
        [LRC, "boot", "--role", role, "--cloud", "azure", "--encoded"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    raw = base64.b64decode(encoded.stdout)
    if raw[:2] == b"\x1f\x8b":  # gzipped to fit (cloud-init unpacks it)
        raw = gzip.decompress(raw)
    assert raw.decode() == whole  # Azure's user data holds every file


def _bash_reads(text: str) -> str:
    """The script as bash parses it: wrapped in a function, printed back by ``declare -f``
    (which drops comments and keeps every string and heredoc)."""
    result = subprocess.run(
        ["bash", "-c", 'eval "f() {\n$SCRIPT\n}" && declare -f f'],
        env={"SCRIPT": text, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return result.stdout


@pytest.mark.parametrize("path", script_files(), ids=lambda p: p.name)
def test_a_node_gets_each_script_as_it_is_parsed_without_its_comments(path: Path) -> None:
    """Bash (or Python) reads the installed script exactly as it reads the repository's."""
    source, installed = path.read_text(), installed_text(path)
    module = path.suffix == ".py"  # imported by a script: no shebang, no --help
    if not module:
        assert installed.splitlines()[0] == source.splitlines()[0]  # the shebang
    assert len(installed) < len(source)
    if module or "python" in source.splitlines()[0]:
        tree = ast.parse(source)
        docstring = ast.get_docstring(tree, clean=False)
        if docstring and module:  # a module's goes
            tree.body = tree.body[1:]
            assert ast.get_docstring(ast.parse(installed)) is None
        elif docstring:  # the module docstring keeps its summary line, what --help prints
            summary = docstring.strip().splitlines()[0]
            tree.body[0] = ast.Expr(ast.Constant(summary))
            assert ast.get_docstring(ast.parse(installed)) == summary
        for node in ast.walk(tree):  # functions and classes lose theirs
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and ast.get_docstring(node):
                node.body = node.body[1:] or [ast.Expr(ast.Constant(...))]
        assert ast.dump(ast.parse(installed)) == ast.dump(tree)
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


# --- metrics: node-exporter on every node, llama-server's /metrics, the metrics port's firewall ---

EXPORTER_DROP_IN = "/etc/systemd/system/prometheus-node-exporter.service.d/llama-rpc.conf"


@pytest.mark.parametrize("node", [MAIN, WORKER], ids=["main", "worker"])
def test_every_node_runs_node_exporter_on_its_private_address(node: NodeBoot) -> None:
    """The package, and a drop-in that binds it to the node's address and port from node.env,
    with the firewall's inbound rules applied (as root) before it listens."""
    config = boot.cloud_config(node)
    assert {"prometheus-node-exporter", "nftables"} <= set(config["packages"])
    entry = files_of(node)[EXPORTER_DROP_IN]
    assert entry["content"] == installed_text(boot.UNITS_DIR / "node-exporter.conf")
    lines = entry["content"].splitlines()
    # An empty ExecStart= first: a drop-in's ExecStart= otherwise adds a second command.
    starts = [ln for ln in lines if ln.startswith("ExecStart=")]
    assert starts == [
        "ExecStart=",
        "ExecStart=/usr/bin/prometheus-node-exporter $ARGS "
        "--web.listen-address=${LLAMA_NODE_IP}:${METRICS_PORT}",
    ]
    assert "ExecStartPre=+/usr/sbin/nft -f /etc/llama-rpc/metrics.nft" in lines
    assert "EnvironmentFile=/etc/llama-rpc/node.env" in lines
    assert files_of(node)["/etc/llama-rpc/metrics.nft"]["permissions"] == "0644"
    env = env_of(node)
    assert env["METRICS_PORT"] == str(METRICS_PORT) == "9100"
    assert env["LLAMA_NODE_IP"] == node.node_ip


def test_the_main_nodes_cluster_network_is_checked_too() -> None:
    with pytest.raises(BootConfigError, match="must be the private network") as refused:
        NodeBoot(**{**MAIN.__dict__, "cluster_cidr": "10.9.0.0/16"})
    assert refused.value.setting == "cluster_cidr"


def test_the_node_image_carries_the_exporter_and_its_key_changes_with_the_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Machines get their packages from the image (offline): every package a cloud-config lists
    is in it, and a changed list names a new image, so the old one is never reused."""
    assert {"prometheus-node-exporter", "nftables"} <= set(image.packages())
    before = image.image_key()
    monkeypatch.setattr(image, "ROLE_PACKAGES", {"main": (), "worker": ("nftables",)})
    assert "prometheus-node-exporter" not in image.packages()
    assert image.image_key() != before


def input_rules(ruleset: str) -> list[str]:
    chain = ruleset.split("chain input {", 1)[1].split("\n  }", 1)[0]
    return [ln.strip() for ln in chain.splitlines()[2:] if ln.strip()]


@pytest.mark.parametrize("role", ROLES)
def test_the_metrics_port_is_as_narrow_as_rpc(role: str) -> None:
    """A worker admits its own group's main node (its RPC sources) and itself; a main node
    itself alone. Its own table (a packet must pass every table's input chain: a worker's RPC
    rules stay as they are), replaced whole by each start of the exporter."""
    extra = {"rpc_allowed_sources": ("10.0.1.10/32",)} if role == "worker" else {}
    node = NodeBoot(**{**boot.example(role).__dict__, **extra, "cluster_cidr": "10.0.0.0/16"})
    ruleset = files_of(node)["/etc/llama-rpc/metrics.nft"]["content"]
    assert ruleset.startswith("table inet llama_rpc_metrics\ndelete table inet llama_rpc_metrics\n")
    admitted = ["tcp dport 9100 ip saddr { 10.0.1.10/32 } accept"] if role == "worker" else []
    assert input_rules(ruleset) == ['iif "lo" accept', *admitted, "tcp dport 9100 drop"]
    assert "llama_rpc " not in ruleset and "50052" not in ruleset and "10.0.0.0/16" not in ruleset


def test_the_metrics_rulesets_are_valid_nftables(tmp_path: Path) -> None:
    """nft itself parses them (-c: checked, nothing applied)."""
    nft = require_tool("nft")
    for node in (MAIN, NodeBoot(**{**WORKER.__dict__, "cluster_cidr": "10.0.0.0/16"})):
        path = tmp_path / "metrics.nft"
        path.write_text(files_of(node)["/etc/llama-rpc/metrics.nft"]["content"])
        checked = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
        if "Operation not permitted" in checked.stderr:
            unavailable("nft -c needs CAP_NET_ADMIN")
        assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("role", "listen", "message"),
    [
        ("main", "every", "is not an IPv4 address"),
        ("main", "8.8.8.8", "is a public address"),
        ("worker", "0.0.0.0", "is for the main node"),
    ],
)
def test_bad_listen_addresses_are_refused(role: str, listen: str, message: str) -> None:
    with pytest.raises(BootConfigError, match=message) as refused:
        NodeBoot(**{**boot.example(role).__dict__, "server_listen": listen})  # type: ignore[arg-type]
    assert refused.value.setting == "server_listen"


# Records its arguments and answers /health on --host:--port, as llama-server does.
FAKE_LLAMA_SERVER = fake_llama_server(
    'echo "main: server is listening on http://$2 - starting the main loop"'
)


@pytest.mark.parametrize("listen", [None, "0.0.0.0"])
def test_llama_server_listens_where_told_serves_metrics_and_checks_health_on_the_node_ip(
    tmp_path: Path, listen: str | None
) -> None:
    """SERVER_LISTEN (from server_listen) becomes --host; /health is still asked on the node's
    own address; --metrics is always on (Prometheus /metrics on the API port)."""
    node = NodeBoot(**{**MAIN.__dict__, "rpc_workers": (), "gpu_layers": 0, "tensor_split": (),
                       "node_ip": "10.0.1.10", "server_listen": listen})  # fmt: skip
    assert env_of(node).get("SERVER_LISTEN") == listen
    prefix, data = fake_main_node(tmp_path, FAKE_LLAMA_SERVER)
    # curl, recording where it asks, then the real one.
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    real_curl = require_tool("curl")
    (wrappers / "curl").write_text(
        f'#!/usr/bin/env bash\nprintf "%s\\n" "$*" >>"{tmp_path}/curl"\nexec {real_curl} "$@"\n'
    )
    (wrappers / "curl").chmod(0o755)
    port = free_port()
    env = {
        "PATH": f"{wrappers}:{os.environ['PATH']}", "LLAMA_RPC_ENV_FILE": str(tmp_path / "absent"),
        "LLAMA_DATA_DIR": str(data), "LLAMA_PREFIX": str(prefix),
        "LLAMA_CPP_COMMIT": LLAMA_CPP_COMMIT, "LLAMA_NODE_IP": "127.0.0.1",
        "SERVER_PORT": str(port), "MODEL_URLS": "https://example.org/model.gguf",
        "LLAMA_THREADS": "1", "FAKE_ARGS": str(tmp_path / "args"),
        **({"SERVER_LISTEN": listen} if listen else {}),
    }  # fmt: skip
    service = subprocess.Popen(
        ["bash", str(SCRIPTS / "llama-server.sh")], env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        status: dict = {}
        while status.get("phase") != "serving":
            assert service.poll() is None and time.monotonic() < deadline, status
            time.sleep(0.05)
            status_file = data / "status.json"
            status = json.loads(status_file.read_text()) if status_file.exists() else {}
    finally:
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=30)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[args.index("--host") + 1] == (listen or "127.0.0.1")
    assert "--metrics" in args
    asked = (tmp_path / "curl").read_text()
    assert f"http://127.0.0.1:{port}/health" in asked and "0.0.0.0" not in asked

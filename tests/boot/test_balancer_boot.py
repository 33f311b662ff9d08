"""The balancer node's boot: a schema-valid cloud-config that installs Debian's HAProxy and runs
the one configuration every balancer runs (the local cluster's too), which HAProxy itself
accepts; the metadata service root's alone, on every boot."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from infra.boot import balancer
from infra.boot.balancer import BalancerBoot, BalancerGuard
from infra.boot.installed import installed_text
from infra.boot.node import VM_PATHS, example
from infra.boot.render import (
    DEALLOCATE_SCRIPT,
    GUARD_UNIT,
    SCRIPTS_DIR,
    UNITS_DIR,
    metadata_ruleset,
)
from tests.conftest import assert_valid_cloud_config, require_tool

BALANCER = BalancerBoot(
    listen_ip="10.0.1.5",
    port=8080,
    mains=("10.0.1.10", "10.0.1.30", "10.0.1.50"),
    server_port=8080,
    slots=2,
    timeout_seconds=2513,
)


def files_of(text: str) -> dict[str, dict[str, object]]:
    return {f["path"]: f for f in yaml.safe_load(text)["write_files"]}


def configured(text: str, path: str) -> dict[str, object]:
    """The write_files entry that becomes ``path`` once the packages are in."""
    return files_of(text)[balancer.staged_path(path)]


def test_the_balancer_nodes_config_passes_the_schema_and_haproxys_check(tmp_path: Path) -> None:
    text = balancer.render(BALANCER)
    assert_valid_cloud_config(text, tmp_path)
    haproxy = require_tool("haproxy")
    config = configured(text, balancer.HAPROXY_CONFIG_PATH)
    path = tmp_path / "haproxy.cfg"
    path.write_text(str(config["content"]))
    checked = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    # HAProxy refuses what it does not know: the check above can fail.
    path.write_text(str(config["content"]).replace("balance leastconn", "balance fewest"))
    broken = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)
    assert broken.returncode != 0


def test_each_group_takes_its_slots_and_the_rest_wait_for_the_first_free() -> None:
    text = str(configured(balancer.render(BALANCER), balancer.HAPROXY_CONFIG_PATH)["content"])
    for group, ip in enumerate(BALANCER.mains):
        assert f"server group{group + 1} {ip}:8080 maxconn 2" in text
    assert "balance leastconn" in text and "bind 10.0.1.5:8080" in text
    assert "option httpchk GET /health" in text and "http-check expect status 200" in text
    for timeout in ("client", "server", "queue"):
        assert f"timeout {timeout} 2513s" in text
    assert "user haproxy" in text and "stats socket" not in text


def test_a_dead_group_leaves_quickly_and_what_got_no_byte_back_is_sent_again() -> None:
    """Checks every second, every quarter second once one has failed, two to take a group out;
    each request read whole into a buffer that holds the bound the docs give, sent again at most
    three times, to another group where one has a slot, never after a timeout; every slot and the
    queue's share within HAProxy's connections (tests/local/test_balancer_retries.py runs them)."""
    text = balancer.haproxy_config(BALANCER)
    assert "default-server check inter 1s fastinter 250ms fall 2 rise 2\n" in text
    assert "default-server observe layer4 error-limit 1 on-error mark-down\n" in text
    assert "    option http-buffer-request\n    timeout http-request 60s\n" in text
    assert "    retries 3\n    option redispatch 1\n" in text
    assert "    retry-on conn-failure empty-response 503\n" in text
    assert "response-timeout" not in text and "all-retryable-errors" not in text
    assert f"    tune.bufsize {256 * 1024}\n" in text
    assert balancer.RETRIED_REQUEST_BYTES == 258_048 < balancer.BUFFER_BYTES
    # Three groups of two slots busy, and the queue's 512.
    assert BALANCER.max_connections == 518 and "    maxconn 518\n" in text


def test_the_packages_come_from_the_retrying_installer_and_then_the_configuration() -> None:
    """cloud-init's one-shot ``packages`` would leave the node without HAProxy for good when its
    NAT route is not carrying traffic yet: the nodes' own installer retries instead."""
    config = yaml.safe_load(balancer.render(BALANCER))
    assert "packages" not in config and "package_update" not in config
    files = files_of(balancer.render(BALANCER))
    for script in ("lib.sh", "install-packages.sh"):
        entry = files[f"{VM_PATHS.bin_dir}/{script}"]
        assert entry["content"] == installed_text(SCRIPTS_DIR / script)
    assert files[balancer.INSTALLER]["permissions"] == "0755"
    commands = [" ".join(command) for command in config["runcmd"]]
    install = (
        f"env LLAMA_PACKAGES=haproxy nftables PACKAGE_ATTEMPTS={balancer.INSTALL_ATTEMPTS} "
        f"{balancer.INSTALLER}"
    )
    assert commands[0] == install and balancer.INSTALL_ATTEMPTS > 5  # more than the nodes'
    # Each configuration goes to its package's path once the package is in, so the package
    # never offers its own in its place; nothing writes there before.
    assert balancer.HAPROXY_CONFIG_PATH not in files
    assert configured(balancer.render(BALANCER), balancer.NFTABLES_CONFIG_PATH)["content"] == (
        metadata_ruleset()
    )
    for path in (balancer.HAPROXY_CONFIG_PATH, balancer.NFTABLES_CONFIG_PATH):
        copy = f"install -m 0644 -o root -g root {balancer.staged_path(path)} {path}"
        assert 0 < commands.index(copy) < commands.index("systemctl restart nftables.service")
    assert commands.index("systemctl restart nftables.service") < commands.index(
        "systemctl restart haproxy.service"
    )
    assert commands.index("haproxy -c -f /etc/haproxy/haproxy.cfg") < commands.index(
        "systemctl restart haproxy.service"
    )


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"mains": ("10.0.1.10",)}, "two groups or more"),
        ({"slots": 0}, "positive"),
        ({"timeout_seconds": 0}, "positive"),
        ({"timeout_seconds": balancer.HAPROXY_MAX_TIMEOUT_SECONDS + 1}, "stop at 2147483 s"),
    ],
)
def test_a_balancer_that_cannot_work_is_refused(changes: dict[str, object], says: str) -> None:
    fields = {**BALANCER.__dict__, **changes}
    with pytest.raises(ValueError, match=says):
        BalancerBoot(**fields)  # type: ignore[arg-type]


def test_the_longest_timeout_allowed_is_one_haproxy_takes_and_one_more_second_is_not(
    tmp_path: Path,
) -> None:
    """HAProxy's own check at the bound: the limit is HAProxy's, not a guess of it."""
    haproxy = require_tool("haproxy")
    longest = BalancerBoot(**{**BALANCER.__dict__, "timeout_seconds": 1})  # type: ignore[arg-type]
    text = balancer.haproxy_config(longest)
    path = tmp_path / "haproxy.cfg"

    def check(seconds: int) -> subprocess.CompletedProcess[str]:
        path.write_text(text.replace(" 1s\n", f" {seconds}s\n"))
        return subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)

    assert check(balancer.HAPROXY_MAX_TIMEOUT_SECONDS).returncode == 0
    over = check(balancer.HAPROXY_MAX_TIMEOUT_SECONDS + 1)
    assert over.returncode != 0 and "timer overflow" in over.stdout + over.stderr


GUARD = BalancerGuard(
    stop_after_idle_seconds=900,
    stop_after_seconds=0,
    serve_deadline_seconds=20_000,
    interval_seconds=30,
    stop_by="azure-deallocate",
)


def test_a_guarded_balancer_node_runs_the_spend_guard_from_the_start_of_each_boot(
    tmp_path: Path,
) -> None:
    """The guard's unit, scripts and settings, started before the packages (whose install may
    never end: the deadline holds then too); HAProxy's stats socket read-only and root's; the
    configuration still one HAProxy accepts."""
    guarded = BalancerBoot(**{**BALANCER.__dict__, "guard": GUARD})  # type: ignore[arg-type]
    text = balancer.render(guarded)
    assert_valid_cloud_config(text, tmp_path)
    files = files_of(text)
    for script in (*balancer.INSTALLER_SCRIPTS, *balancer.GUARD_SCRIPTS, DEALLOCATE_SCRIPT):
        entry = files[f"{VM_PATHS.bin_dir}/{script}"]
        assert entry["content"] == installed_text(SCRIPTS_DIR / script)
        assert entry["owner"] == "root:root"
    assert files[f"/etc/systemd/system/{GUARD_UNIT}"]["content"] == installed_text(
        UNITS_DIR / GUARD_UNIT
    )
    env = files[VM_PATHS.env_file]
    assert (env["owner"], env["permissions"]) == ("root:root", "0600")
    settings = dict(line.split("=", 1) for line in str(env["content"]).splitlines())
    assert settings["LLAMA_ROLE"] == "'balancer'"
    assert settings["STOP_AFTER_IDLE_SECONDS"] == "'900'"
    assert settings["SERVE_DEADLINE_SECONDS"] == "'20000'"
    assert settings["STOP_BY"] == "'azure-deallocate'"
    assert settings["BALANCER_STATS_SOCKET"] == f"'{balancer.GUARD_STATS_SOCKET}'"
    assert settings["BALANCER_BACKEND"] == f"'{balancer.BACKEND}'"
    commands = [" ".join(command) for command in yaml.safe_load(text)["runcmd"]]
    started = commands.index(f"systemctl enable --now --no-block {GUARD_UNIT}")
    assert started < commands.index(next(c for c in commands if balancer.INSTALLER in c))
    config = str(configured(text, balancer.HAPROXY_CONFIG_PATH)["content"])
    assert f"stats socket {balancer.GUARD_STATS_SOCKET} mode 600 level user\n" in config
    assert balancer.GUARD_STATS_SOCKET.startswith("/run/") and "level admin" not in config
    haproxy = require_tool("haproxy")
    path = tmp_path / "haproxy.cfg"
    path.write_text(config)
    checked = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    # A guard that powers off (AWS, GCP) has no deallocation to run.
    poweroff = replace(guarded, guard=replace(GUARD, stop_by="poweroff"))
    assert f"{VM_PATHS.bin_dir}/{DEALLOCATE_SCRIPT}" not in files_of(balancer.render(poweroff))
    # Without a guard, none of it.
    plain = files_of(balancer.render(BALANCER))
    assert VM_PATHS.env_file not in plain and f"/etc/systemd/system/{GUARD_UNIT}" not in plain


def test_the_balancer_nodes_guard_has_its_groups_limits() -> None:
    main = replace(
        example("main"),
        stop_after_idle_seconds=600,
        stop_after_seconds=7200,
        serve_deadline_seconds=9000,
        guard_interval_seconds=30,
        stop_by="azure-deallocate",
    )
    assert balancer.balancer_guard(main) == BalancerGuard(600, 7200, 9000, 30, "azure-deallocate")
    assert balancer.balancer_guard(example("main")) is None  # the groups have none


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"stop_after_idle_seconds": 0}, "has a limit"),
        ({"stop_after_seconds": -1}, "0 \\(off\\) or more"),
        ({"serve_deadline_seconds": 0}, "positive"),
        ({"interval_seconds": 0}, "positive"),
        ({"stop_by": "terminate"}, "is not one of poweroff, azure-deallocate"),
    ],
)
def test_a_balancer_guard_that_cannot_work_is_refused(
    changes: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        replace(GUARD, **changes)

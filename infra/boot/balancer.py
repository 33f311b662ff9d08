"""The balancer in front of a stack's serving groups: HAProxy, configured here once for every
place it runs (a cloud's balancer node, booted by the cloud-config below, and the local
cluster's balancer, ``infra.local.balancer``).

It sends a request only to a group whose main node answers llama-server's ``GET /health`` with
200 (a group that is loading answers 503), and only to a group with a free slot: each group takes
at most its slots at once, the group with the fewest open requests gets the next request, and a
request that no group can take now waits in HAProxy's queue, in arrival order, for the first
group to free a slot, never inside one group's own queue behind a long generation. One HAProxy
counts every open request; a cloud's managed balancers count per node or proxy and queue nothing.

A group that loses a worker goes down whole: its main node's llama-server aborts (llama.cpp
#26724), the requests it had open end with no answer, and its supervisor restarts it. The
balancer takes such a group out within seconds and sends a request that got no byte back to
another group; a request whose answer had begun (a stream) is never sent twice.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra.boot.cloud_yaml import dump
from infra.boot.installed import installed_text
from infra.boot.node import STOP_BY, VM_PATHS, NodeBoot, render_env_file
from infra.boot.render import (
    APT_CONF,
    DEALLOCATE_SCRIPT,
    GUARD_SCRIPT,
    GUARD_UNIT,
    SCRIPTS_DIR,
    UNITS_DIR,
    metadata_ruleset,
)
from infra.core import layout

# The response header naming the group that answered (HAProxy's server name, "group1", …).
SERVED_BY_HEADER = "X-Served-By"
BACKEND = "groups"
# Health checks. llama-server answers /health from its HTTP threads without touching the model
# (200 once loaded, 503 while loading), so checking often costs nothing. A group is checked every
# second, and every quarter second once a check has failed or passed against its state: two
# failures in a row take it out, within 1.25 s of its port closing (one failed check is a blip,
# not a death; a main node that hangs costs CHECK_TIMEOUT a check), and two passes bring it back
# once its model is loaded. Traffic is quicker still: one refused connection takes a group out at
# once (``observe layer4``).
CHECK_INTERVAL = "1s"
CHECK_FAST_INTERVAL = "250ms"
CHECK_TIMEOUT = "2s"
CHECKS_TO_FALL = 2
CHECKS_TO_RISE = 2
# Sending a request again (HAProxy's L7 retries), to another group with a free slot if there is
# one, and only when it got no byte back: its connection refused or failed, or closed or reset
# before a whole answer's headers (what an aborting llama-server leaves), or llama-server's 503
# (its model loading). Not a server timeout: it strikes after a whole generation's time (the
# timeouts below), and a retry would start that generation again. Not a malformed answer
# (junk-response): a dying llama-server sends none (headers cut short count as empty), and a group
# that sends one would get it again. Three retries: when every other group's slots are busy the
# first goes back to the dying group (HAProxy sends a retry to another server only if one has a
# free slot), whose refused connection takes it out; the second waits in the queue for another
# group's slot; the third is for a dying process that still takes a connection as it goes. A
# request that itself makes llama-server abort therefore reaches at most 1 + RETRIES groups.
RETRIES = 3
RETRY_ON = ("conn-failure", "empty-response", "503")
# HAProxy sends a request again only from a copy of it, whole, in one buffer (tune.bufsize, 16 KiB
# by default), made when it is first sent, and only if all of it had come by then: so each request
# is read whole before it is sent (``option http-buffer-request``; the client has REQUEST_TIMEOUT
# to send it), into a 256 KiB buffer. A request of up to RETRIED_REQUEST_BYTES, headers and body,
# can be sent again; a larger one is passed on as it comes, with no copy, and gets HAProxy's 502
# if its group dies before answering.
BUFFER_BYTES = 256 * 1024
# The buffer less HAProxy's reserve for rewriting headers (tune.maxrewrite: 1,024 bytes with a
# buffer this size) and its framing of the message (HTX: a few bytes a header).
RETRIED_REQUEST_BYTES = BUFFER_BYTES - 4 * 1024
REQUEST_TIMEOUT = "60s"
# Client connections HAProxy holds beyond every group's slots (global maxconn): requests waiting
# in its queue, and connections idle between requests (for REQUEST_TIMEOUT at most). They bound
# its memory, a few buffers of BUFFER_BYTES an open request (its own, its copy, its answer's), and
# its file descriptors (two a connection). More wait in the kernel's backlog until one ends.
QUEUED_REQUESTS = 512
HAPROXY_PACKAGES = ("haproxy", "nftables")
# The nodes' own installer, which retries apt with a growing delay: the balancer node may boot
# before its NAT route carries traffic, and cloud-init's `packages` runs once.
INSTALLER_SCRIPTS = ("lib.sh", "install-packages.sh")
INSTALLER = f"{VM_PATHS.bin_dir}/install-packages.sh"
# About 35 minutes of attempts (10, 20, ... s, at most 300 between two).
INSTALL_ATTEMPTS = 10
# Where a balancer node keeps the configuration: the packages' own paths, copied there from
# STAGED_DIR once the packages are in, so a package never offers its own in their place.
HAPROXY_CONFIG_PATH = "/etc/haproxy/haproxy.cfg"
HAPROXY_UNIT = "haproxy.service"
# The metadata service is root's alone here too, as on every node: nftables' own unit loads its
# file on every boot.
NFTABLES_CONFIG_PATH = "/etc/nftables.conf"
NFTABLES_UNIT = "nftables.service"
STAGED_DIR = "/etc/llama-rpc/balancer"
# With a spend guard: HAProxy's stats socket, which the guard (root) reads. Root's: HAProxy binds
# it as root before it drops to its user, in root's /run, read-only (level user), mode 600.
GUARD_STATS_SOCKET = "/run/llama-rpc-balancer.sock"
# The guard's scripts beside the installer's: the node's status file (the stop's reason) and,
# on Azure, the deallocation with the node's own identity.
GUARD_SCRIPTS = ("llama-rpc-status", GUARD_SCRIPT)


def staged_path(path: str) -> str:
    """Where the boot writes a configuration file before its package is installed."""
    return f"{STAGED_DIR}/{path.rsplit('/', 1)[1]}"


# The longest timeout HAProxy takes: `haproxy -c` refuses more with "timer overflow ... maximum
# value is 2147483647 ms (~24.8 days)" (src/proxy.c, proxy_parse_timeout). In whole seconds.
HAPROXY_MAX_TIMEOUT_SECONDS = 2_147_483_647 // 1000


def group_server_name(group: int) -> str:
    """HAProxy's name for a serving group (0-based): ``group1``, ``group2``, … (the contract's
    ``groups`` order)."""
    return f"group{group + 1}"


@dataclass(frozen=True)
class BalancerGuard:
    """A balancer node's spend guard (``llama-rpc-guard``, role ``balancer``): the limits of the
    groups behind it, in seconds (0: off), how long their boot may take to serve, how often it
    looks, and how it stops the node (``STOP_BY``)."""

    stop_after_idle_seconds: int
    stop_after_seconds: int
    serve_deadline_seconds: int
    interval_seconds: int
    stop_by: str

    def __post_init__(self) -> None:
        if self.stop_after_idle_seconds < 0 or self.stop_after_seconds < 0:
            raise ValueError(
                f"a guard's limits are 0 (off) or more, got {self.stop_after_idle_seconds} and "
                f"{self.stop_after_seconds}"
            )
        if not (self.stop_after_idle_seconds or self.stop_after_seconds):
            raise ValueError("a guard has a limit: stop_after_idle_seconds or stop_after_seconds")
        if self.serve_deadline_seconds < 1 or self.interval_seconds < 1:
            raise ValueError(
                f"serve_deadline_seconds and interval_seconds are positive, got "
                f"{self.serve_deadline_seconds} and {self.interval_seconds}"
            )
        if self.stop_by not in STOP_BY:
            raise ValueError(f"stop_by {self.stop_by!r} is not one of {', '.join(STOP_BY)}")

    def env(self) -> dict[str, str]:
        """The guard's environment file on the balancer node."""
        return {
            "LLAMA_ROLE": "balancer",
            "STOP_AFTER_IDLE_SECONDS": str(self.stop_after_idle_seconds),
            "STOP_AFTER_SECONDS": str(self.stop_after_seconds),
            "SERVE_DEADLINE_SECONDS": str(self.serve_deadline_seconds),
            "STOP_BY": self.stop_by,
            "GUARD_INTERVAL_SECONDS": str(self.interval_seconds),
            "BALANCER_STATS_SOCKET": GUARD_STATS_SOCKET,
            "BALANCER_BACKEND": BACKEND,
            "LLAMA_DATA_DIR": VM_PATHS.data_dir,
            "LLAMA_STATUS_FILE": f"{VM_PATHS.data_dir}/status.json",
        }


def balancer_guard(main: NodeBoot) -> BalancerGuard | None:
    """The guard of a balancer in front of groups whose main node boots as ``main``: the groups'
    own limits, serve deadline, interval and way of stopping, so the balancer node stops when
    they do; None when they have no guard."""
    if not main.guarded:
        return None
    return BalancerGuard(
        stop_after_idle_seconds=main.stop_after_idle_seconds,
        stop_after_seconds=main.stop_after_seconds,
        serve_deadline_seconds=main.serve_deadline_seconds,
        interval_seconds=main.guard_interval_seconds,
        stop_by=main.stop_by,
    )


@dataclass(frozen=True)
class BalancerBoot:
    """What the balancer needs to know: where it listens, each group's main node, the slots
    each has, and the longest a request may generate or wait (seconds); on a balancer node of a
    stack with a spend guard, the guard."""

    listen_ip: str
    port: int
    mains: tuple[str, ...]
    server_port: int
    slots: int
    timeout_seconds: int
    guard: BalancerGuard | None = None

    def __post_init__(self) -> None:
        if len(self.mains) < 2:
            raise ValueError(f"a balancer is for two groups or more, got {list(self.mains)}")
        if self.slots < 1 or self.timeout_seconds < 1:
            raise ValueError(
                f"slots and timeout_seconds are positive, got {self.slots} and "
                f"{self.timeout_seconds}"
            )
        if self.timeout_seconds > HAPROXY_MAX_TIMEOUT_SECONDS:
            raise ValueError(
                f"HAProxy's timeouts stop at {HAPROXY_MAX_TIMEOUT_SECONDS} s, got "
                f"{self.timeout_seconds}"
            )

    @property
    def max_connections(self) -> int:
        """The connections HAProxy holds at once: every group's slots busy and QUEUED_REQUESTS
        waiting."""
        return len(self.mains) * self.slots + QUEUED_REQUESTS


def balancer_boot(
    subnet: ipaddress.IPv4Network,
    mains: Sequence[str],
    *,
    server_port: int,
    slots: int,
    timeout_seconds: int,
    guard: BalancerGuard | None = None,
) -> BalancerBoot | None:
    """The balancer in front of these serving groups' main nodes, at the private subnet's
    balancer address (``layout.balancer_ip``), taking requests on the server port, watched by
    ``guard`` on a balancer node; None for one group, which serves alone. The one place that
    decides whether there is a balancer: the stack (``ClusterConfig.balancer_boot``) and the
    local cluster ask it, and everything else asks them for the boot."""
    if len(mains) < 2:
        return None
    return BalancerBoot(
        listen_ip=layout.balancer_ip(subnet),
        port=server_port,
        mains=tuple(mains),
        server_port=server_port,
        slots=slots,
        timeout_seconds=timeout_seconds,
        guard=guard,
    )


# Main nodes named by DNS (Kubernetes pods): the names are resolved through the system's
# nameservers, again while HAProxy runs (a group's pod comes back at another address), and a name
# that does not resolve yet leaves its server down until it does.
RESOLVERS = "system"


def haproxy_config(
    balancer: BalancerBoot,
    *,
    stats_socket: str | None = None,
    stats_level: str = "admin",
    run_as: str | None = None,
    by_name: bool = False,
) -> str:
    """HAProxy's configuration: one frontend on the balancer's address, one backend server per
    serving group's main node (``by_name``: the main nodes are DNS names), and with
    ``stats_socket`` a socket of root's at ``stats_level`` (``admin`` or ``user``, read-only)."""
    servers = "\n".join(
        f"    server {group_server_name(g)} {ip}:{balancer.server_port} maxconn {balancer.slots}"
        for g, ip in enumerate(balancer.mains)
    )
    stats = (
        f"    stats socket {stats_socket} mode 600 level {stats_level}\n" if stats_socket else ""
    )
    user = f"    user {run_as}\n    group {run_as}\n" if run_as else ""
    timeout = balancer.timeout_seconds
    checks = (
        f"check inter {CHECK_INTERVAL} fastinter {CHECK_FAST_INTERVAL} fall {CHECKS_TO_FALL} "
        f"rise {CHECKS_TO_RISE}"
    )
    resolvers = (
        f"resolvers {RESOLVERS}\n    parse-resolv-conf\n    hold valid 10s\n\n" if by_name else ""
    )
    by_dns = (
        f"    default-server resolvers {RESOLVERS} init-addr last,libc,none\n" if by_name else ""
    )
    return f"""\
# Rendered by infra/boot/balancer.py; checked with `haproxy -c -f` before it runs.
global
    log stdout format raw daemon
    # A request is sent again from a copy of it, whole, in one buffer: one of up to
    # {RETRIED_REQUEST_BYTES} bytes can be.
    tune.bufsize {BUFFER_BYTES}
    # Every group's slots busy, and {QUEUED_REQUESTS} requests waiting for one.
    maxconn {balancer.max_connections}
{stats}{user}
{resolvers}defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    # A generation answers only when it is done (unless streamed), and a request may wait in
    # the queue for one to end: these outlast a slot's whole context at the decode speed.
    timeout client {timeout}s
    timeout server {timeout}s
    timeout queue {timeout}s
    timeout check {CHECK_TIMEOUT}
    # Each request is read whole before it is sent to a group, so that it can be sent again.
    option http-buffer-request
    timeout http-request {REQUEST_TIMEOUT}
    # A request that got no byte back from its group (refused, closed or reset before a whole
    # answer's headers, or 503 while loading) is sent again, to another group; one whose answer
    # has begun is not: a stream is never sent twice.
    retries {RETRIES}
    option redispatch 1
    retry-on {" ".join(RETRY_ON)}
    # A client that closes its connection gives its request up: dropped from the queue, or
    # closed to its group, whose llama-server stops generating it and frees the slot. Without
    # it HAProxy waits for the whole answer, a generation nobody reads holding a group's slot.
    option abortonclose

frontend api
    bind {balancer.listen_ip}:{balancer.port}
    default_backend {BACKEND}

backend {BACKEND}
    # Requests run for seconds to minutes: the group with the fewest open requests gets the
    # next one (turn by turn among equals). A group takes no more than its slots (maxconn): a
    # request none can take now waits here, in arrival order, and goes to the first group that
    # frees a slot, never into one group's own queue behind a long generation.
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server {checks}
    # A group whose connection fails is taken out at once, not after its checks fail: a retry
    # goes to another server than the last, and when the others are full (maxconn) the only one
    # left would be the dead one; taken out, the retry waits in the queue instead.
    default-server observe layer4 error-limit 1 on-error mark-down
{by_dns}    http-response set-header {SERVED_BY_HEADER} %[srv_name]
{servers}
"""


def cloud_config(balancer: BalancerBoot) -> dict[str, Any]:
    """A balancer node's cloud-config as data (validated by ``cloud-init schema`` in the
    tests): Debian's HAProxy under its own unit, installed by the nodes' retrying installer,
    this configuration checked before it starts, and the metadata service root's alone, as on
    every node. With a guard, the spend guard runs from the first moment of each boot, as on the
    groups' nodes, before the packages (whose install may not end)."""
    guard = balancer.guard
    configs = {
        HAPROXY_CONFIG_PATH: haproxy_config(
            balancer,
            stats_socket=GUARD_STATS_SOCKET if guard else None,
            stats_level="user",
            run_as="haproxy",
        ),
        NFTABLES_CONFIG_PATH: metadata_ruleset(),
    }
    names = list(INSTALLER_SCRIPTS)
    if guard is not None:
        names += GUARD_SCRIPTS
        if guard.stop_by == "azure-deallocate":
            names.append(DEALLOCATE_SCRIPT)
    scripts = [
        {
            "path": f"{VM_PATHS.bin_dir}/{script}",
            "owner": "root:root",
            "permissions": "0644" if script == "lib.sh" else "0755",
            "content": installed_text(SCRIPTS_DIR / script),
        }
        for script in names
    ]
    staged = [
        {
            "path": staged_path(path),
            "owner": "root:root",
            "permissions": "0644",
            "content": content,
        }
        for path, content in configs.items()
    ]
    guarding: list[dict[str, str]] = []
    start_guard: list[list[str]] = []
    if guard is not None:
        guarding = [
            {
                "path": f"/etc/systemd/system/{GUARD_UNIT}",
                "owner": "root:root",
                "permissions": "0644",
                "content": installed_text(UNITS_DIR / GUARD_UNIT),
            },
            {
                # Root's alone, as on every node (systemd reads it as root).
                "path": VM_PATHS.env_file,
                "owner": "root:root",
                "permissions": "0600",
                "content": render_env_file(guard.env()),
            },
        ]
        start_guard = [
            ["systemctl", "daemon-reload"],
            ["systemctl", "enable", "--now", "--no-block", GUARD_UNIT],
        ]
    return {
        "apt": {"conf": APT_CONF},
        "write_files": scripts + staged + guarding,
        # The packages, then their configuration; the metadata rules first: HAProxy never
        # needs the node's credentials.
        "runcmd": [
            *start_guard,
            [
                "env",
                f"LLAMA_PACKAGES={' '.join(HAPROXY_PACKAGES)}",
                f"PACKAGE_ATTEMPTS={INSTALL_ATTEMPTS}",
                INSTALLER,
            ],
            *(
                ["install", "-m", "0644", "-o", "root", "-g", "root", staged_path(path), path]
                for path in configs
            ),
            ["systemctl", "enable", NFTABLES_UNIT],
            ["systemctl", "restart", NFTABLES_UNIT],
            ["haproxy", "-c", "-f", HAPROXY_CONFIG_PATH],
            ["systemctl", "enable", HAPROXY_UNIT],
            ["systemctl", "restart", HAPROXY_UNIT],
        ],
    }


def render(balancer: BalancerBoot) -> str:
    """A balancer node's user data: ``#cloud-config`` and the body as YAML."""
    return "#cloud-config\n" + dump(cloud_config(balancer))

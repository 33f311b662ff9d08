"""Linux network namespaces that play a cloud network: one namespace per node, a bridge as the VPC.

    host ──veth── main ─┐
                        ├── bridge (in its own "vpc" namespace)
          worker 1 ─────┤
          worker 2 ─────┘

The nodes get the VPC's fixed addresses (.10 main, .11, .12, … workers; with replicas each
further serving group's main at .30, .50, …, and the balancer's namespace at .5) and no default
route, so nothing they send can leave the namespaces. The host reaches the first group's main
node alone, over its own link (as a laptop reaches the main node through a cloud tunnel), never
the workers; the balancer is reached from inside the VPC, as a cloud's internal one is. While the
cluster is up, the host routes the rest of its range nowhere (an ``unreachable`` route), so
nothing the host addresses to the range can leave the machine by the default route; a range that
one of the host's routes already uses is refused before anything is made.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass

# Linux's limit on an interface's name (IFNAMSIZ less its terminating zero): each node's end of
# its link on the bridge is named after the node.
MAX_INTERFACE_NAME = 15


class NetnsError(RuntimeError):
    """A namespace operation failed; the message carries the command and its error."""


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {result.stderr.strip() or result.returncode}")
    return result


def exec_prefix(namespace: str | None) -> list[str]:
    """The argv prefix that runs a command inside ``namespace`` (nothing for the host)."""
    return ["ip", "netns", "exec", namespace] if namespace else []


@dataclass(frozen=True)
class VpcNetwork:
    """The namespaces and addresses of one local cluster."""

    cluster_id: str
    cidr: ipaddress.IPv4Network
    node_names: tuple[str, ...]  # "main" first (the host's link goes to it), then the others
    node_ips: tuple[str, ...]

    def __post_init__(self) -> None:
        too_long = [n for n in self.node_names if len(n) > MAX_INTERFACE_NAME]
        if too_long:
            raise NetnsError(
                f"node names {too_long} name interfaces: keep them to {MAX_INTERFACE_NAME} "
                "characters"
            )

    @property
    def vpc_namespace(self) -> str:
        return f"lrc-{self.cluster_id}-vpc"

    def namespace(self, node: str) -> str:
        return f"lrc-{self.cluster_id}-{node}"

    @property
    def host_interface(self) -> str:
        return f"lrc-{self.cluster_id}"[:15]

    @property
    def host_link(self) -> tuple[str, str]:
        """Host-side and main-side addresses of the host's link to the main node."""
        # One /30 per /24 of the VPC (its second and third octets), so two local clusters on
        # different /24s never share the link's addresses. Kept in 169.254.0.0/17, away from
        # 169.254.169.254, the cloud metadata address a host may need.
        packed = self.cidr.network_address.packed
        block = ipaddress.IPv4Address("169.254.0.0") + 4 * ((packed[1] << 8 | packed[2]) % 8192)
        return str(block + 1), str(block + 2)

    def namespaces(self) -> list[str]:
        return [self.vpc_namespace, *(self.namespace(n) for n in self.node_names)]

    def create(self) -> None:
        """Create every namespace, link and address; on any failure remove what was made."""
        self.check_range_is_free()
        try:
            self._create()
        except Exception:
            self.destroy()
            raise

    def check_range_is_free(self) -> None:
        """Refuse a range that the host already routes somewhere (a LAN, a VPN, docker):
        the cluster's routes would take that traffic over."""
        shown = run("ip", "-o", "-4", "route", "show", "table", "all").stdout
        for line in shown.splitlines():
            destination = line.split()[0] if line.split() else ""
            if destination in ("default", "broadcast", "local", "multicast"):
                continue
            try:
                network = ipaddress.IPv4Network(destination)
            except ValueError:
                continue
            if network.overlaps(self.cidr):
                raise NetnsError(
                    f"--cidr {self.cidr} overlaps this machine's route {line.strip()!r}; give a "
                    "private range that no route here uses"
                )

    def _create(self) -> None:
        # Sealed first: from here on, the host sends nothing addressed to the range anywhere.
        run("ip", "route", "add", "unreachable", str(self.cidr))
        vpc = self.vpc_namespace
        run("ip", "netns", "add", vpc)
        run("ip", "-n", vpc, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", vpc, "link", "set", "br0", "up")
        for name, ip in zip(self.node_names, self.node_ips, strict=True):
            ns = self.namespace(name)
            run("ip", "netns", "add", ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run(
                "ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                "peer", "name", name, "netns", vpc,
            )  # fmt: skip
            run("ip", "-n", vpc, "link", "set", name, "master", "br0", "up")
            run("ip", "-n", ns, "addr", "add", f"{ip}/{self.cidr.prefixlen}", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
        host_ip, main_ip = self.host_link
        main_ns = self.namespace(self.node_names[0])
        run(
            "ip", "link", "add", self.host_interface, "type", "veth",
            "peer", "name", "tunnel", "netns", main_ns,
        )  # fmt: skip
        run("ip", "addr", "add", f"{host_ip}/30", "dev", self.host_interface)
        run("ip", "link", "set", self.host_interface, "up")
        run("ip", "-n", main_ns, "addr", "add", f"{main_ip}/30", "dev", "tunnel")
        run("ip", "-n", main_ns, "link", "set", "tunnel", "up")
        run("ip", "route", "add", f"{self.node_ips[0]}/32", "via", main_ip)

    def add_outsider(self, name: str, ip: str, prefixlen: int) -> str:
        """A namespace on the VPC bridge with an address of its choosing (for firewall tests)."""
        ns = self.namespace(name)
        run("ip", "netns", "add", ns)
        run(
            "ip", "link", "add", "eth0", "netns", ns, "type", "veth",
            "peer", "name", name, "netns", self.vpc_namespace,
        )  # fmt: skip
        run("ip", "-n", self.vpc_namespace, "link", "set", name, "master", "br0", "up")
        run("ip", "-n", ns, "addr", "add", f"{ip}/{prefixlen}", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "route", "replace", str(self.cidr), "dev", "eth0")
        return ns

    def main_is_routed_here(self) -> bool:
        """True when the host's route to the main node goes over this cluster's own link.

        Checked before the host sends anything to the main node's address, so a missing route
        can never send cluster traffic to a real network.
        """
        result = run("ip", "-o", "route", "get", self.node_ips[0], check=False)
        return result.returncode == 0 and f" dev {self.host_interface} " in result.stdout + " "

    def destroy(self) -> None:
        """Remove the cluster's namespaces and host link; missing pieces are fine."""
        _, main_ip = self.host_link
        run("ip", "route", "del", f"{self.node_ips[0]}/32", "via", main_ip, check=False)
        run("ip", "link", "del", self.host_interface, check=False)
        run("ip", "route", "del", "unreachable", str(self.cidr), check=False)
        existing = set(run("ip", "netns", "list", check=False).stdout.split())
        for ns in sorted(existing):
            if ns.startswith(f"lrc-{self.cluster_id}-"):
                run("ip", "netns", "del", ns, check=False)


def namespace_pids(namespace: str) -> list[int]:
    """Processes running inside ``namespace``."""
    out = run("ip", "netns", "pids", namespace, check=False).stdout
    return [int(pid) for pid in out.split()]

"""Cloud-init for the cluster's nodes: one cloud-config body per role (``render``), delivered per
cloud (``deliver``), from each node's checked settings (``NodeBoot``)."""

from infra.boot.deliver import Delivery, deliver
from infra.boot.node import (
    API_KEY_CREDENTIAL,
    VM_API_KEY_FILE,
    VM_PATHS,
    BootConfigError,
    NodeBoot,
    NodePaths,
    checksums_problem,
    example,
    render_env_file,
)
from infra.boot.render import (
    BOOT_UNIT,
    GUARD_UNIT,
    ROLE_SCRIPTS,
    ROLE_UNIT,
    SCRIPTS_DIR,
    UNITS_DIR,
    cloud_config,
    node_scripts,
    node_units,
    render,
)

__all__ = [
    "API_KEY_CREDENTIAL",
    "BOOT_UNIT",
    "GUARD_UNIT",
    "ROLE_SCRIPTS",
    "ROLE_UNIT",
    "SCRIPTS_DIR",
    "UNITS_DIR",
    "VM_API_KEY_FILE",
    "VM_PATHS",
    "BootConfigError",
    "Delivery",
    "NodeBoot",
    "NodePaths",
    "checksums_problem",
    "cloud_config",
    "deliver",
    "example",
    "node_scripts",
    "node_units",
    "render",
    "render_env_file",
]

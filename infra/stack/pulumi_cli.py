"""The Pulumi CLI, as ``lrc`` asks it what only Pulumi knows: a stack's config as Pulumi resolves
it (its ESC environments, service-managed config, secrets) and a deployed stack's outputs.

Each answer is one run of ``pulumi ... --json``, without the Python SDK (its import alone takes
most of a second), and each failure is one sentence that names the fix: the CLI missing, no
login, no such stack, or the passphrase of a stack whose secrets it keeps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

PULUMI = "pulumi"
TIMEOUT_SECONDS = 180.0  # opening an ESC environment reaches the service
INSTALL = (
    "the Pulumi CLI is not on PATH: install it (https://www.pulumi.com/docs/install/) and log "
    "in to the backend that holds your stacks (`pulumi login`, or `pulumi login --local`)"
)
LOCKED_SECRETS = (
    "the stack's secrets are kept with a passphrase: set PULUMI_CONFIG_PASSPHRASE (or "
    "PULUMI_CONFIG_PASSPHRASE_FILE) as for `pulumi up`, or move the stack to a backend or "
    "secrets provider that needs none (docs/before-up.md)"
)


class PulumiError(RuntimeError):
    """The Pulumi CLI could not answer; the message says why and what to do."""


def available() -> bool:
    return shutil.which(PULUMI) is not None


def explain(stderr: str, stack: str) -> str:
    """What Pulumi's complaint means for ``stack``, and the command that fixes it."""
    text = " ".join(stderr.split())
    lowered = text.lower()
    if "no stack named" in lowered or "stack not found" in lowered:
        return (
            f"stack {stack!r} is not in the Pulumi backend you are logged in to (`pulumi whoami "
            f"-v` names it): create it with `pulumi up --stack {stack}`, or `pulumi login` to "
            "the backend that holds it"
        )
    if "passphrase" in lowered:
        if "incorrect passphrase" in lowered:
            return (
                "the passphrase in PULUMI_CONFIG_PASSPHRASE is not this stack's: " + LOCKED_SECRETS
            )
        return LOCKED_SECRETS
    if "pulumi_access_token" in lowered or "not logged in" in lowered:
        return (
            "not logged in to a Pulumi backend: `pulumi login` (Pulumi Cloud), `pulumi login "
            "--local`, or the backend the stack was created in"
        )
    first = next((line.strip() for line in stderr.splitlines() if line.strip()), "")
    return f"pulumi: {first.removeprefix('error: ')[:400]}" if first else "pulumi failed"


def run(args: list[str], *, stack: str, cwd: Path, timeout: float = TIMEOUT_SECONDS) -> str:
    """``pulumi ARGS --stack STACK`` in the project directory ``cwd``; its standard output."""
    if not available():
        raise PulumiError(INSTALL)
    argv = [PULUMI, *args, "--stack", stack, "--non-interactive"]
    environ = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    try:
        result = subprocess.run(
            argv, cwd=cwd, env=environ, capture_output=True, text=True, check=False,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise PulumiError(f"`{' '.join(argv[:3])}` did not answer in {timeout:g} s") from None
    except OSError as error:
        raise PulumiError(f"cannot run pulumi: {error.strerror or error}") from None
    if result.returncode != 0:
        raise PulumiError(explain(result.stderr or result.stdout, stack))
    return result.stdout


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError:
        raise PulumiError(f"{what} did not print JSON: {text.strip()[:200]!r}") from None


def outputs(stack: str, cwd: Path) -> dict[str, Any]:
    """The deployed stack's outputs (``pulumi stack output --json``); a secret one shows as
    ``[secret]``: nothing ``lrc`` reads from outputs is one."""
    found = _json(run(["stack", "output", "--json"], stack=stack, cwd=cwd), "pulumi stack output")
    if not isinstance(found, dict):
        raise PulumiError("pulumi stack output did not print an object")
    return found


class Secret:
    """A config value Pulumi keeps encrypted, known to be set; its value is not read here."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"Secret({self.key!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.key == self.key

    def __hash__(self) -> int:
        return hash(("Secret", self.key))


def config(stack: str, cwd: Path, *, show_secrets: bool = False) -> dict[str, Any]:
    """The stack's config as the program sees it (``pulumi config --json``: the stack file, its
    ESC environments, service-managed config and the project's values): each key's value, an
    object as its object; a secret is a ``Secret`` unless ``show_secrets``."""
    args = ["config", "--json", *(["--show-secrets"] if show_secrets else [])]
    listed = _json(run(args, stack=stack, cwd=cwd), "pulumi config")
    if not isinstance(listed, dict):
        raise PulumiError("pulumi config did not print an object")
    values: dict[str, Any] = {}
    for key, entry in listed.items():
        if not isinstance(entry, dict):
            continue
        if entry.get("secret") and not show_secrets:
            values[key] = Secret(key)
        elif entry.get("objectValue") is not None:
            values[key] = entry["objectValue"]
        elif entry.get("value") is not None:
            values[key] = entry["value"]
    return values

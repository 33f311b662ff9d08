"""What every cloud's live operations share: the ``LiveCloud`` interface each cloud implements
(``infra.live.aws``, ``.gcp``, ``.azure``), the user's way into an account (``Access``), the
command channel, the object store a model part is staged into, and the errors they raise.

Nothing here imports a cloud SDK: each cloud module imports its own inside the call that needs
it, so the config check, the planner and the boot renderer never load one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from infra.core import outputs as keys
from infra.preflight.account import Account
from infra.preflight.api import Transport, urllib_transport
from infra.preflight.needs import Needs

CLI_TIMEOUT_SECONDS = 3600.0
# A login check or a token is quick, or the CLI is stuck (a prompt, a dead network).
LOGIN_TIMEOUT_SECONDS = 60.0
# Seconds a start request may take; the nodes then boot on their own.
START_TIMEOUT_SECONDS = 300.0
SHA256_METADATA = "sha256"


class LiveError(RuntimeError):
    """A live account did not answer as asked; the message says where and why."""


class ChannelError(LiveError):
    """The command did not run, or failed; the message says where and why."""


class AccessError(LiveError):
    """This machine cannot reach the cloud's API at all: no credentials, no CLI, no login, or no
    route to the endpoint. Not a node's state: a command stops at once, with the message (it
    names the fix), where a node that does not answer is reported and waited for."""


class CredentialsError(AccessError):
    """No credentials for the cloud, or no CLI to reach it with: the message says how to get
    them."""


class PowerError(LiveError):
    """The cloud refused or failed to start the nodes, or to say their state."""


class StageError(RuntimeError):
    """The model could not be staged; the message says why and what to do."""


class Runner(Protocol):
    """Runs a cloud CLI; gives up (``ChannelError``) after ``timeout`` seconds."""

    def __call__(
        self, argv: Sequence[str], timeout: float = CLI_TIMEOUT_SECONDS
    ) -> subprocess.CompletedProcess[str]: ...


# How to get each CLI the product runs, for the error that says it is missing.
CLI_INSTALL = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and run "
    "`gcloud auth login`",
    "az": "install the Azure CLI (https://learn.microsoft.com/cli/azure/install-azure-cli) and "
    "run `az login`",
    "aws": "install the AWS CLI and its Session Manager plugin (https://docs.aws.amazon.com/cli/)",
    "pulumi": "install the Pulumi CLI (https://www.pulumi.com/docs/install/)",
}


def missing_cli(name: str) -> CredentialsError:
    """The error for a CLI that is not on PATH, with how to install it."""
    how = CLI_INSTALL.get(name, f"install {name}")
    return CredentialsError(f"{name} is not on PATH: {how}")


def run_cli(
    argv: Sequence[str], timeout: float = CLI_TIMEOUT_SECONDS
) -> subprocess.CompletedProcess[str]:
    """A CLI's answer; ``ChannelError`` when it does not finish in ``timeout`` seconds,
    ``CredentialsError`` when it is not there to run."""
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, check=False, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ChannelError(f"{' '.join(argv[:3])} did not finish in {timeout:g} s") from None
    except FileNotFoundError:
        raise missing_cli(argv[0]) from None
    except OSError as error:  # not executable, or the system refused to start it
        raise CredentialsError(f"cannot run {argv[0]}: {error.strerror or error}") from None


@dataclass(frozen=True)
class Access:
    """The user's own way into a stack's account: its region, the stack file's values (such as
    ``gcp:project`` and ``aws:profile``), the environment, and how a cloud's CLI, REST API and
    boto3 clients are reached (tests hand in recorded ones)."""

    region: str
    values: Mapping[str, Any] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    runner: Runner = run_cli
    which: Callable[[str], str | None] = shutil.which
    transport: Transport = urllib_transport
    # (service, region) -> a boto3 client; None: boto3's own, with the user's credentials.
    aws_clients: Callable[[str, str], Any] | None = None


def cli_text(access: Access, argv: list[str], *, install: str, login: str) -> str:
    """A login-bound CLI's answer (a token, an account); ``CredentialsError`` says how to install
    the CLI (``install``) or log in (``login``), with the CLI's own first line of complaint."""
    if access.which(argv[0]) is None:
        raise CredentialsError(f"{argv[0]} is not on PATH: {install}")
    try:
        result = access.runner(argv, LOGIN_TIMEOUT_SECONDS)
    except (ChannelError, OSError) as error:
        raise CredentialsError(f"{login} ({error})") from None
    if result.returncode != 0:
        first = next((line for line in result.stderr.splitlines() if line.strip()), "")
        raise CredentialsError(f"{login} ({first.strip()[:300]})" if first else login)
    return result.stdout.strip()


def power_call(argv: list[str], runner: Runner) -> str:
    """A CLI's answer to a power call (start, state); ``PowerError`` with its complaint."""
    try:
        result = runner(argv, START_TIMEOUT_SECONDS)
    except AccessError:  # no CLI: said as it is, with its fix
        raise
    except (LiveError, OSError) as error:
        raise PowerError(f"{' '.join(argv[:4])}: {error}") from None
    if result.returncode != 0:
        raise PowerError(f"{' '.join(argv[:4])}: {result.stderr.strip()[-500:]}")
    return str(result.stdout)


class Channel(Protocol):
    """Runs a command as root on one node and brings its output back."""

    # The most output it brings back (characters); None: all of it.
    max_output: int | None

    def run(self, command: list[str], timeout: float) -> str: ...


def named_output(stack_outputs: Mapping[str, Any], key: str, flag: str) -> str | None:
    """An output a live call needs; a stack deployed before the output existed names it in its
    ``connectCommand`` (``--zone``, ``--resource-group``)."""
    value = stack_outputs.get(key)
    if value:
        return str(value)
    found = re.search(rf"{flag}[ =](\S+)", str(stack_outputs.get(keys.CONNECT_COMMAND, "")))
    return found.group(1) if found else None


# The preflight's reader of an account: what the stack needs -> what the account has.
Reader = Callable[[Needs], Account]


@dataclass(frozen=True)
class Piece:
    size: int
    md5: str  # hex


class Store(Protocol):
    """Where model parts go, piece by piece (``infra.stage.upload`` drives it). ``put`` may run
    in several threads at once."""

    def url(self, key: str) -> str: ...

    def check_region(self, region: str) -> None:
        """Refuse a store the stack's nodes would not read from its region."""

    def have(self, key: str) -> str | None:
        """The sha256 of ``key`` when the store holds it whole."""

    def earlier(self, key: str) -> dict[int, Piece]:
        """The pieces of ``key`` an earlier run left, by number (1, 2, ...)."""

    def put(self, key: str, number: int, data: bytes) -> None: ...

    def finish(self, key: str, numbers: list[int], sha256: str) -> None:
        """Join the pieces, in order, into ``key`` with its sha256; drop what staged them."""

    def discard(self, key: str) -> None:
        """Drop every piece of ``key`` (its bytes were wrong)."""


class LiveCloud(ABC):
    """Everything the product asks of a live account on one cloud, with the user's own
    credentials (the Pulumi program's preflight: the provider's). One implementation per cloud,
    registered in ``infra.live.LIVE``."""

    name: ClassVar[str]  # as in infra.clouds.FACTS
    # The Pulumi provider's own settings its preflight reads with (``aws:profile``).
    provider_settings: ClassVar[tuple[str, ...]]
    # The cloud's words for a VM that is not running and costs no compute.
    stopped_states: ClassVar[frozenset[str]]
    store_name: ClassVar[str]  # its object store, as errors name it
    store_credentials: ClassVar[str]  # what to check when the store's SDK refuses
    sdk_packages: ClassVar[tuple[str, ...]]  # the top-level packages of its SDK's errors

    # --- the preflight -------------------------------------------------------------------------

    @abstractmethod
    def program_reader(self, settings: Mapping[str, Any]) -> Reader:
        """Inside the Pulumi program: the account read with the provider's own credentials
        (``settings``: its ``provider_settings``, such as ``aws:profile``)."""

    @abstractmethod
    def cli_reader(self, access: Access) -> Reader:
        """On the command line: the account read with the user's CLI login."""

    @abstractmethod
    def credentials(self, access: Access) -> list[str]:
        """What the user lacks to reach the account (a CLI, a login, a project), each with its
        fix; empty when nothing is missing. The readers refuse with the same sentences."""

    # --- a deployed stack ----------------------------------------------------------------------

    @abstractmethod
    def channels(
        self, stack_outputs: Mapping[str, Any], mains: list[str], access: Access
    ) -> list[Channel]:
        """A command channel to each of ``mains``, the serving groups' main nodes."""

    @abstractmethod
    def start(self, stack_outputs: Mapping[str, Any], ids: list[str], access: Access) -> list[str]:
        """Start the nodes ``ids``; a line per node with its state."""

    @abstractmethod
    def power_states(
        self, stack_outputs: Mapping[str, Any], ids: list[str], access: Access
    ) -> dict[str, str]:
        """Each node's state, in the cloud's words (``stopped_states`` among them)."""

    @abstractmethod
    def leftovers(self, stack: str, access: Access) -> list[str]:
        """What the account still holds that carries the stack's tags or labels."""

    # --- staging a model -----------------------------------------------------------------------

    @abstractmethod
    def check_bucket(self, bucket: str) -> None:
        """Refuse (``StageError``) a ``--bucket`` its store cannot name."""

    @abstractmethod
    def open_store(self, bucket: str, *, region: str, endpoint: str | None) -> Store:
        """The store a stack in ``region`` reads from, with the user's own credentials;
        ``endpoint``: another API of the same kind (an emulator)."""

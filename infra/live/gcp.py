"""Google Cloud, live, with the user's own login (gcloud, and Application Default Credentials for
Cloud Storage):

- which project: the stack file's ``gcp:project``, then ``GOOGLE_CLOUD_PROJECT``, then gcloud's
  own (``gcloud config get-value project``): one rule for every command;
- the preflight's reads (Compute Engine API): the region's zones that are up and which of them
  offer the machine types, the region's CPU quotas and the project's CPUs in all regions (limit
  and use), the vCPUs of the stack's own running VMs, told apart by their labels, and the
  caller's own permissions on the project (Resource Manager's testIamPermissions);
- the command channel: SSH through Identity-Aware Proxy, the command run with sudo;
- power: ``gcloud compute instances start`` and ``describe``;
- the cost run's audit: instances, disks and addresses labelled with the stack;
- the object store: Cloud Storage, each piece an object ``KEY.staging/NNNNNN`` (its MD5 checked
  by the server), composed 32 at a time into ``KEY``, which gets the sha256.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

from infra.clouds import gcp as gcp_facts
from infra.clouds.base import VcpuQuota
from infra.core import outputs as keys
from infra.core.layout import PROJECT
from infra.live.base import (
    LOGIN_TIMEOUT_SECONDS,
    SHA256_METADATA,
    Access,
    Channel,
    ChannelError,
    CredentialsError,
    LiveCloud,
    LiveError,
    Piece,
    PowerError,
    Reader,
    Runner,
    StageError,
    Store,
    cli_text,
    named_output,
    power_call,
    run_cli,
)
from infra.preflight.account import Account, QuotaReading, Unread
from infra.preflight.api import ApiError, JsonApi
from infra.preflight.needs import Needs

BASE = "https://compute.googleapis.com/compute/v1/"
RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com/v1/"
INSTALL = "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)"
LOGIN = "no gcloud login: run `gcloud auth login`"
NO_PROJECT = (
    "no GCP project: set `gcp:project` in the stack file, GOOGLE_CLOUD_PROJECT, or gcloud's own "
    "(`gcloud config set project PROJECT`)"
)
# A VM that is stopped or suspended holds no CPU quota.
IDLE_STATES = {"STOPPED", "STOPPING", "TERMINATED", "SUSPENDED", "SUSPENDING"}
INCREASE = (
    "the Quotas page, https://console.cloud.google.com/iam-admin/quotas?project={project}, "
    "{metric} in {region}, to {{value}}"
)
INCREASE_ALL_REGIONS = (
    "the Quotas page, https://console.cloud.google.com/iam-admin/quotas?project={project}, "
    "CPUS_ALL_REGIONS (global), to {{value}}"
)
STAGING = ".staging"
COMPOSE_LIMIT = 32  # Cloud Storage composes at most 32 objects in one request


def project(access: Access) -> str:
    """The project every command reads: the stack file's ``gcp:project``, then
    ``GOOGLE_CLOUD_PROJECT``, then gcloud's configured one; "" when none names one."""
    named = access.values.get("gcp:project") or access.environ.get("GOOGLE_CLOUD_PROJECT")
    if named:
        return str(named)
    if access.which("gcloud") is None:
        return ""
    try:
        result = access.runner(["gcloud", "config", "get-value", "project"], LOGIN_TIMEOUT_SECONDS)
    except (LiveError, OSError):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def _token(access: Access) -> str:
    return cli_text(access, ["gcloud", "auth", "print-access-token"], install=INSTALL, login=LOGIN)


def _project_or(error: type[LiveError], access: Access) -> str:
    """The project, or ``error`` naming every place it may be set."""
    found = project(access)
    if not found:
        raise error(NO_PROJECT)
    return found


def _location(
    stack_outputs: Mapping[str, Any], access: Access, error: type[LiveError]
) -> tuple[str, str]:
    """The zone and project of the stack's nodes, or ``error`` naming what is missing."""
    zone = named_output(stack_outputs, keys.ZONE, "--zone")
    if zone is None:
        raise error("a GCP stack's nodes are found by its zone (the stack's `zone` output)")
    return zone, _project_or(error, access)


# --- the preflight's reads ------------------------------------------------------------------------


def vcpus_of(machine_type: str) -> int:
    """A C4A (or other predefined) type's vCPUs, the number its name ends with."""
    found = re.search(r"-(\d+)$", machine_type)
    return int(found.group(1)) if found else 0


def _zone_offers(api: JsonApi, project: str, needs: Needs) -> dict[str, frozenset[str]]:
    up = {
        zone["name"]
        for page in api.pages(f"projects/{project}/zones")
        for zone in page.get("items", [])
        if zone.get("status") == "UP" and zone.get("region", "").endswith(f"/{needs.region}")
    }
    offers: dict[str, set[str]] = {zone: set() for zone in up}
    names = "|".join(needs.types)  # machine type names hold no regular-expression syntax
    for page in api.pages(
        f"projects/{project}/aggregated/machineTypes", {"filter": f'name eq "({names})"'}
    ):
        for scope, found in page.get("items", {}).items():
            zone = scope.removeprefix("zones/")
            if zone in offers:
                offers[zone] |= {m["name"] for m in found.get("machineTypes", [])}
    return {zone: frozenset(types) for zone, types in offers.items()}


def _own_vcpus(api: JsonApi, project: str, needs: Needs) -> dict[VcpuQuota, float]:
    labels = " AND ".join(f'(labels.{k} = "{v}")' for k, v in sorted(needs.tags.items()))
    own: dict[VcpuQuota, float] = {}
    for page in api.pages(f"projects/{project}/aggregated/instances", {"filter": labels}):
        for scope, found in page.get("items", {}).items():
            if not scope.startswith(f"zones/{needs.region}-"):
                continue
            for vm in found.get("instances", []):
                if vm.get("status") in IDLE_STATES:
                    continue
                machine = str(vm.get("machineType", "")).rsplit("/", 1)[-1]
                quota = gcp_facts.vcpu_quota(machine)
                own[quota] = own.get(quota, 0.0) + vcpus_of(machine)
    return own


def _lacking(
    api: JsonApi, project: str, needs: Needs, unread: list[Unread]
) -> frozenset[str] | None:
    """The needs' rights the caller lacks on the project (Resource Manager's
    testIamPermissions answers with those it holds)."""
    if not needs.rights:
        return None
    asked = sorted({right.action for right in needs.rights})
    try:
        held = api.post(
            f"{RESOURCE_MANAGER}projects/{project}:testIamPermissions", {"permissions": asked}
        ).get("permissions", [])
    except ApiError as error:
        unread.append(Unread("your permissions", str(error)))
        return None
    return frozenset(asked) - set(held)


def read_account(needs: Needs, api: JsonApi, project: str) -> Account:
    unread: list[Unread] = []
    zone_offers = None
    try:
        zone_offers = _zone_offers(api, project, needs)
    except ApiError as error:
        unread.append(Unread("which zones offer the machine types", str(error)))
    quotas: dict[str, tuple[float, float]] = {}
    try:
        region = api.get(f"projects/{project}/regions/{needs.region}")
        quotas = {
            q["metric"]: (q.get("limit", 0.0), q.get("usage", 0.0))
            for q in region.get("quotas", [])
        }
    except ApiError as error:
        unread.append(Unread(f"the CPU quotas of {needs.region}", str(error)))
    own: dict[VcpuQuota, float] = {}
    try:
        own = _own_vcpus(api, project, needs)
    except ApiError as error:
        unread.append(Unread("the stack's own running VMs", str(error)))
    readings = []
    for quota in needs.quota_needs():
        limit, used = quotas.get(quota.id, (None, None))
        if quota.id not in quotas and not any(u.what.startswith("the CPU quotas") for u in unread):
            # regions.get leaves out what it cannot say (its quotaStatusWarning): not zero.
            unread.append(Unread(f"the quota {quota.id}", f"{needs.region} reports none"))
        readings.append(
            QuotaReading(
                quota,
                limit,
                used,
                own.get(quota, 0.0),
                INCREASE.format(project=project, metric=quota.id, region=needs.region),
            )
        )
    try:
        whole = api.get(f"projects/{project}")
        found = {q["metric"]: q for q in whole.get("quotas", [])}
        total = found.get(gcp_facts.ALL_REGIONS_CPUS.id)
        if total is None:
            unread.append(
                Unread(f"the quota {gcp_facts.ALL_REGIONS_CPUS.id}", "the project reports none")
            )
        else:
            readings.append(
                QuotaReading(
                    gcp_facts.ALL_REGIONS_CPUS,
                    total.get("limit", 0.0),
                    total.get("usage", 0.0),
                    sum(own.values()),
                    INCREASE_ALL_REGIONS.format(project=project),
                )
            )
    except ApiError as error:
        unread.append(Unread("the project's CPU quota in all regions", str(error)))
    lacking = _lacking(api, project, needs, unread)
    return Account(
        "gcp",
        needs.region,
        zone_offers=zone_offers,
        quotas=tuple(readings),
        lacking=lacking,
        unread=tuple(unread),
    )


# --- the command channel --------------------------------------------------------------------------


class IapChannel:
    """SSH through Identity-Aware Proxy with gcloud, the command run with sudo."""

    max_output = gcp_facts.FACTS.command_output_chars

    def __init__(self, instance: str, zone: str, project: str, runner: Runner = run_cli):
        self.instance, self.zone, self.project, self.runner = instance, zone, project, runner

    def run(self, command: list[str], timeout: float) -> str:
        result = self.runner([
            "gcloud", "compute", "ssh", self.instance, "--zone", self.zone,
            "--project", self.project, "--tunnel-through-iap", "--quiet",
            "--command", f"sudo {shlex.join(command)}",
        ], timeout)  # fmt: skip
        if result.returncode != 0:
            raise ChannelError(
                f"gcloud compute ssh {self.instance}: {result.stderr.strip()[-500:]}"
            )
        return result.stdout


# --- the object store -----------------------------------------------------------------------------


class GcsStore:
    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket  # a google.cloud.storage Bucket

    def url(self, key: str) -> str:
        return f"gs://{self.bucket.name}/{key}"

    def check_region(self, region: str) -> None:
        self.bucket.reload()
        if str(self.bucket.location).lower() != region.lower():
            raise StageError(
                f"bucket {self.bucket.name} is in {self.bucket.location}, the stack in "
                f"{region}: use a bucket in {region}, as docs/gcp.md says"
            )

    def have(self, key: str) -> str | None:
        blob = self.bucket.get_blob(key)
        found = (blob.metadata or {}).get(SHA256_METADATA) if blob is not None else None
        return str(found) if found else None

    def _piece_name(self, key: str, number: int) -> str:
        return f"{key}{STAGING}/{number:06d}"

    def earlier(self, key: str) -> dict[int, Piece]:
        found: dict[int, Piece] = {}
        for blob in self.bucket.list_blobs(prefix=f"{key}{STAGING}/"):
            number = blob.name.rsplit("/", 1)[-1]
            if number.isdigit() and blob.md5_hash:
                found[int(number)] = Piece(blob.size, base64.b64decode(blob.md5_hash).hex())
        return found

    def put(self, key: str, number: int, data: bytes) -> None:
        blob = self.bucket.blob(self._piece_name(key, number))
        blob.md5_hash = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        blob.upload_from_string(data, content_type="application/octet-stream")

    def finish(self, key: str, numbers: list[int], sha256: str) -> None:
        sources = [self.bucket.blob(self._piece_name(key, n)) for n in numbers]
        made, round_ = [], 0
        while len(sources) > COMPOSE_LIMIT:  # compose in rounds, 32 into one
            round_ += 1
            joined = []
            for index in range(0, len(sources), COMPOSE_LIMIT):
                into = self.bucket.blob(f"{key}{STAGING}/round{round_}-{index:06d}")
                into.compose(sources[index : index + COMPOSE_LIMIT])
                joined.append(into)
            made += joined
            sources = joined
        final = self.bucket.blob(key)
        final.metadata = {SHA256_METADATA: sha256}
        final.compose(sources)
        self.discard(key)

    def discard(self, key: str) -> None:
        for blob in self.bucket.list_blobs(prefix=f"{key}{STAGING}/"):
            blob.delete()


class Gcp(LiveCloud):
    name = "gcp"
    provider_settings = ()
    # Compute Engine's statuses.
    stopped_states = frozenset({"STOPPING", "TERMINATED"})
    store_name = "Cloud Storage"
    store_credentials = (
        "your Application Default Credentials (gcloud auth application-default login)"
    )
    sdk_packages = ("google",)

    def program_reader(self, settings: Mapping[str, Any]) -> Reader:  # noqa: ARG002 (the LiveCloud interface)
        """Google's token and project from the provider's own ``getClientConfig``."""

        def read(needs: Needs) -> Account:
            import pulumi_gcp  # noqa: PLC0415

            found = pulumi_gcp.organizations.get_client_config()
            if not found.project:
                raise CredentialsError(
                    "no GCP project: set it with `pulumi config set gcp:project <project>`"
                )
            return read_account(needs, JsonApi(BASE, found.access_token), found.project)

        return read

    def cli_reader(self, access: Access) -> Reader:
        def read(needs: Needs) -> Account:
            token = _token(access)
            api = JsonApi(BASE, token, access.transport)
            return read_account(needs, api, _project_or(CredentialsError, access))

        return read

    def credentials(self, access: Access) -> list[str]:
        try:
            _token(access)
        except CredentialsError as error:
            return [str(error)]
        return [] if project(access) else [NO_PROJECT]

    def channels(
        self, stack_outputs: Mapping[str, Any], mains: list[str], access: Access
    ) -> list[Channel]:
        _token(access)  # gcloud there and logged in: else one line with the fix, not a node's
        zone, found = _location(stack_outputs, access, ChannelError)
        return [IapChannel(main, zone, found, access.runner) for main in mains]

    def start(self, stack_outputs: Mapping[str, Any], ids: list[str], access: Access) -> list[str]:
        """``gcloud compute instances start``, every node at once (a TERMINATED VM starts; a
        running one is left as it is)."""
        zone, found = _location(stack_outputs, access, PowerError)
        argv = ["gcloud", "compute", "instances", "start", *ids, "--zone", zone, "--project", found]
        power_call(argv, access.runner)
        return [f"{node}: starting" for node in ids]

    def power_states(
        self, stack_outputs: Mapping[str, Any], ids: list[str], access: Access
    ) -> dict[str, str]:
        """Each VM's Compute Engine status (RUNNING, STOPPING, TERMINATED, ...)."""
        zone, found = _location(stack_outputs, access, PowerError)
        return {
            node: power_call(["gcloud", "compute", "instances", "describe", node, "--zone",
                              zone, "--project", found, "--format=value(status)"],
                             access.runner).strip()
            for node in ids
        }  # fmt: skip

    def leftovers(self, stack: str, access: Access) -> list[str]:
        """Instances, disks and addresses labelled with the stack (networks and firewall rules
        carry no labels; they go with the stack's destroy, which the audit follows)."""
        found = _project_or(CredentialsError, access)
        labelled = f"labels.stack={gcp_facts.label_value(stack)} AND labels.project={PROJECT}"
        leftovers = []
        for kind in ("instances", "disks", "addresses"):
            result = access.runner([
                "gcloud", "compute", kind, "list", "--project", found, f"--filter={labelled}",
                "--format=json",
            ])  # fmt: skip
            if result.returncode != 0:
                raise LiveError(f"gcloud compute {kind} list: {result.stderr.strip()[-300:]}")
            listed = json.loads(result.stdout or "[]")
            leftovers += [f"{kind[:-1]} {item['name']}" for item in listed]
        return leftovers

    def check_bucket(self, bucket: str) -> None:
        """Any bucket name: Cloud Storage says whether it is there."""

    def open_store(
        self,
        bucket: str,
        *,
        region: str,  # noqa: ARG002 (the LiveCloud interface; check_region asks the store)
        endpoint: str | None,
    ) -> Store:
        """Application Default Credentials (``gcloud auth application-default login``);
        ``endpoint``: a Cloud Storage emulator, which takes none."""
        from google.cloud import storage  # noqa: PLC0415

        if endpoint:
            from google.auth.credentials import AnonymousCredentials  # noqa: PLC0415

            client = storage.Client(
                project="local", credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                client_options={"api_endpoint": endpoint},
            )  # fmt: skip
        else:
            client = storage.Client()
        return GcsStore(client.bucket(bucket))

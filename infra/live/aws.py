"""AWS, live, with the user's own credentials through boto3 (imported by the call that needs it):

- the preflight's reads: the region's availability zones that need no opt-in, their zone ids,
  and which of them offer the instance types (EC2), the On-Demand vCPU quotas (Service
  Quotas), the vCPUs of the instances running in the region, the stack's own told apart by
  its tags, and whether a model volume whose throughput changes is still being modified (EC2);
- the command channel: SSM ``send_command``, as root;
- power: EC2 StartInstances and DescribeInstances;
- the cost run's audit: everything tagged with the stack (Resource Groups Tagging API);
- the object store: S3, a multipart upload of ``KEY.staging``, then a copy to ``KEY`` with the
  sha256 as metadata (a multipart upload takes no metadata at the end); a piece's ETag is its MD5.
"""

from __future__ import annotations

import datetime
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from infra.clouds import aws as aws_facts
from infra.clouds.base import VcpuQuota
from infra.core import outputs as keys
from infra.core.layout import PROJECT
from infra.live.base import (
    SHA256_METADATA,
    Access,
    AccessError,
    Channel,
    ChannelError,
    CredentialsError,
    LiveCloud,
    LiveError,
    Piece,
    PowerError,
    Reader,
    StageError,
    Store,
)
from infra.preflight.account import Account, QuotaReading, Unread
from infra.preflight.needs import Needs

NO_CREDENTIALS = (
    "no AWS credentials: set AWS_PROFILE (after `aws sso login`), or AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY"
)
# What an instance counts against its quota in while it runs (stopped ones do not count).
RUNNING_STATES = ["pending", "running"]
INCREASE = (
    "`aws service-quotas request-service-quota-increase --region {region} --service-code ec2 "
    "--quota-code {code} --desired-value {{value}}`"
)
RUN_SHELL_SCRIPT = "AWS-RunShellScript"
# AWS's answers that say the credentials are not (or no longer) good.
REFUSED_CREDENTIALS = frozenset({
    "ExpiredToken", "ExpiredTokenException", "UnrecognizedClientException",
    "InvalidClientTokenId", "InvalidSignatureException", "SignatureDoesNotMatch", "AuthFailure",
    "RequestExpired",
})  # fmt: skip
DENIED = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
STAGING = ".staging"
# The staged object is copied from KEY.staging in pieces of the upload's size
# (infra.stage.upload.PART_BYTES; S3 takes 5 MiB to 5 GiB a piece).
COPY_PIECE_BYTES = 64 * 2**20


def session(region: str, profile: str | None = None) -> Any:
    """Every boto3 session the product opens: the user's credentials (``profile``: the stack's
    ``aws:profile``, which the preflight reads with, as the provider deploys with it)."""
    import boto3  # noqa: PLC0415 (only AWS stacks need it)

    return boto3.Session(profile_name=profile, region_name=region)


def profile_of(values: Mapping[str, Any]) -> str | None:
    """The stack file's ``aws:profile``: every command reads the account the stack deploys to."""
    found = values.get("aws:profile")
    return str(found) if found else None


def client(access: Access, service: str, *, endpoint: str | None = None) -> Any:
    """A client of ``service`` in the access's region, with the stack's profile (a stubbed one
    when the access has them)."""
    if access.aws_clients is not None:
        return access.aws_clients(service, access.region)
    return session(access.region, profile_of(access.values)).client(service, endpoint_url=endpoint)


def _credentials(found: Any) -> list[str]:
    return [NO_CREDENTIALS] if found.get_credentials() is None else []


def call_error(error: Exception, what: str, *, node: str = "") -> LiveError:
    """A botocore error of the call ``what`` (``SSM SendCommand``), as the product's own: the
    user's side (no credentials, refused ones, no route to the endpoint, a permission) is an
    ``AccessError`` naming the fix; a node SSM cannot reach (``InvalidInstanceId``: not running,
    or its agent not yet registered, as right after ``pulumi up``) and anything else is a
    ``ChannelError``, which a reading reports as ``unreachable``."""
    from botocore import exceptions as botocore  # noqa: PLC0415

    if isinstance(error, botocore.ClientError):
        return _answer_error(error, what, node)
    if isinstance(
        error,
        botocore.NoCredentialsError
        | botocore.PartialCredentialsError
        | botocore.SSOError
        | botocore.TokenRetrievalError
        | botocore.CredentialRetrievalError
        | botocore.NoAuthTokenError,
    ):
        return CredentialsError(f"{what}: {NO_CREDENTIALS} ({error})")
    if isinstance(error, botocore.ProfileNotFound):
        return CredentialsError(
            f"{what}: {error}: set AWS_PROFILE or the stack's aws:profile to a profile in "
            "~/.aws/config (`aws configure list-profiles`)"
        )
    if isinstance(error, botocore.NoRegionError):
        return AccessError(f"{what}: no AWS region: set the stack's aws:region")
    if isinstance(error, botocore.ConnectionError):
        return AccessError(
            f"{what}: cannot reach AWS ({error}): check this machine's network (a VPN, a "
            "proxy: HTTPS_PROXY) and the region"
        )
    return ChannelError(f"{what}: {error}")


def _answer_error(error: Any, what: str, node: str) -> LiveError:
    """What AWS answered (a ``ClientError``), as ``call_error`` says it."""
    found = error.response.get("Error", {})
    code, message = str(found.get("Code", "")), str(found.get("Message", "")).strip()
    if code == "InvalidInstanceId":
        return ChannelError(
            f"{what}: SSM cannot reach {node or 'the node'}: it is not running, or its SSM "
            "agent has not registered yet (InvalidInstanceId)"
        )
    if code in REFUSED_CREDENTIALS:
        return CredentialsError(
            f"{what}: AWS refused the credentials ({code}): renew them (`aws sso login`, or new "
            "keys) and check AWS_PROFILE"
        )
    if code in DENIED:
        return AccessError(
            f"{what}: your AWS identity is not allowed ({code}: {message[:300]}); docs/top.md "
            "lists what watching a stack needs"
        )
    return ChannelError(f"{what}: {code}: {message[:300]}".rstrip(": "))


def power_error(error: Exception, what: str) -> LiveError:
    """A power call's botocore error: this machine's side as it is, the rest a ``PowerError``."""
    found = call_error(error, what)
    return found if isinstance(found, AccessError) else PowerError(str(found))


# --- the preflight's reads ------------------------------------------------------------------------


def _why(error: Exception) -> str:
    from botocore.exceptions import ClientError  # noqa: PLC0415

    if isinstance(error, ClientError):
        found = error.response.get("Error", {})
        return f"{found.get('Code', 'error')}: {found.get('Message', '')}".strip(": ")
    return str(error)


def _zones(ec2: Any, types: tuple[str, ...]) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
    """Zones that need no opt-in (no Local or Wavelength Zone) and are available, with the
    types each offers; and each one's zone id."""
    listed = ec2.describe_availability_zones(
        Filters=[
            {"Name": "opt-in-status", "Values": ["opt-in-not-required"]},
            {"Name": "zone-type", "Values": ["availability-zone"]},
        ]
    )["AvailabilityZones"]
    ids = {z["ZoneName"]: z["ZoneId"] for z in listed if z.get("State") == "available"}
    zones = set(ids)
    offers: dict[str, set[str]] = {zone: set() for zone in zones}
    arguments: dict[str, Any] = {
        "LocationType": "availability-zone",
        "Filters": [{"Name": "instance-type", "Values": list(types)}],
    }
    while True:
        page = ec2.describe_instance_type_offerings(**arguments)
        for offer in page["InstanceTypeOfferings"]:
            if offer["Location"] in offers:
                offers[offer["Location"]].add(offer["InstanceType"])
        if not page.get("NextToken"):
            return {zone: frozenset(found) for zone, found in offers.items()}, ids
        arguments["NextToken"] = page["NextToken"]


def _running(
    ec2: Any, needs: Needs, quota_of: Callable[[str], VcpuQuota | None]
) -> tuple[dict[VcpuQuota, float], dict[VcpuQuota, float]]:
    """vCPUs of every On-Demand instance running in the region, and of the stack's own, by
    quota."""
    used: dict[VcpuQuota, float] = {}
    own: dict[VcpuQuota, float] = {}
    arguments: dict[str, Any] = {
        "Filters": [{"Name": "instance-state-name", "Values": RUNNING_STATES}]
    }
    while True:
        page = ec2.describe_instances(**arguments)
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                quota = quota_of(instance["InstanceType"])
                if quota is None or instance.get("InstanceLifecycle"):  # spot: its own quotas
                    continue
                cpu = instance.get("CpuOptions", {})
                vcpus = float(cpu.get("CoreCount", 0) * cpu.get("ThreadsPerCore", 1))
                used[quota] = used.get(quota, 0.0) + vcpus
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                if all(tags.get(k) == v for k, v in needs.tags.items()):
                    own[quota] = own.get(quota, 0.0) + vcpus
        if not page.get("NextToken"):
            return used, own
        arguments["NextToken"] = page["NextToken"]


# A volume modification EC2 is still making: another one is refused until it completes.
UNFINISHED_MODIFICATIONS = {"modifying", "optimizing"}


def _busy_volumes(ec2: Any, needs: Needs) -> dict[str, tuple[str, int, str]]:
    """The stack's model volumes whose throughput the stack changes while their last
    modification is not completed (EC2's ModifyVolume: "you must wait for that modification to
    reach the completed state before you can initiate another")."""
    filters = [{"Name": f"tag:{key}", "Values": [value]} for key, value in needs.tags.items()]
    filters.append({"Name": "tag:role", "Values": ["main"]})
    changing: dict[str, int] = {}
    arguments: dict[str, Any] = {"Filters": filters}
    while True:
        page = ec2.describe_volumes(**arguments)
        for volume in page["Volumes"]:
            tags = {t["Key"]: t["Value"] for t in volume.get("Tags", [])}
            throughput = int(volume.get("Throughput", 0))
            if (
                tags.get("Name", "").endswith("-model")
                and throughput != needs.model_disk_throughput
            ):
                changing[volume["VolumeId"]] = throughput
        if not page.get("NextToken"):
            break
        arguments["NextToken"] = page["NextToken"]
    if not changing:
        return {}
    found = ec2.describe_volumes_modifications(VolumeIds=sorted(changing))
    return {
        m["VolumeId"]: (m["ModificationState"], changing[m["VolumeId"]], _when(m.get("StartTime")))
        for m in found["VolumesModifications"]
        if m.get("ModificationState") in UNFINISHED_MODIFICATIONS
    }


def _when(started: Any) -> str:
    """A modification's start as botocore gives it (a datetime), in UTC to the minute."""
    if isinstance(started, datetime.datetime):
        return started.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return str(started)


def read_account(needs: Needs, ec2: Any, service_quotas: Any) -> Account:
    """Read the account with an EC2 and a Service Quotas client of the stack's region."""
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    unread: list[Unread] = []
    zone_offers = None
    zone_ids: dict[str, str] = {}
    try:
        zone_offers, zone_ids = _zones(ec2, needs.types)
    except (ClientError, BotoCoreError) as error:
        unread.append(Unread("which zones offer the instance types", _why(error)))
    used: dict[VcpuQuota, float] | None = None
    own: dict[VcpuQuota, float] = {}
    try:
        used, own = _running(ec2, needs, aws_facts.vcpu_quota)
    except (ClientError, BotoCoreError) as error:
        unread.append(Unread("the vCPUs already running in the region", _why(error)))
    readings = []
    for quota in needs.quota_needs():
        limit = None
        try:
            found = service_quotas.get_service_quota(ServiceCode="ec2", QuotaCode=quota.id)
            limit = float(found["Quota"]["Value"])
        except (ClientError, BotoCoreError) as error:
            unread.append(Unread(f"the quota {quota.id}", _why(error)))
        readings.append(
            QuotaReading(
                quota,
                limit,
                None if used is None else used.get(quota, 0.0),
                own.get(quota, 0.0),
                INCREASE.format(region=needs.region, code=quota.id),
            )
        )
    busy: dict[str, tuple[str, int, str]] = {}
    if needs.model_disk_throughput is not None:
        try:
            busy = _busy_volumes(ec2, needs)
        except (ClientError, BotoCoreError) as error:
            unread.append(Unread("the model volumes' last changes", _why(error)))
    return Account(
        "aws",
        needs.region,
        zone_offers=zone_offers,
        zone_ids=zone_ids,
        busy_volumes=busy,
        quotas=tuple(readings),
        unread=tuple(unread),
    )


def _reader(profile: str | None) -> Reader:
    def read(needs: Needs) -> Account:
        found = session(needs.region, profile)
        if missing := _credentials(found):
            raise CredentialsError(missing[0])
        return read_account(needs, found.client("ec2"), found.client("service-quotas"))

    return read


# --- the command channel --------------------------------------------------------------------------


class SsmChannel:
    """``AWS-RunShellScript`` through SSM, as root, polled until it ends. A command that one of
    ``documents`` runs exactly is sent as that document instead (the stack's metrics reading),
    so a watcher needs ``ssm:SendCommand`` on that document alone."""

    max_output = aws_facts.FACTS.command_output_chars

    def __init__(
        self,
        ssm: Any,
        instance_id: str,
        sleep: Callable[[float], None] = time.sleep,
        documents: Mapping[tuple[str, ...], str] | None = None,
    ):
        self.ssm, self.instance_id, self.sleep = ssm, instance_id, sleep
        self.documents = dict(documents or {})
        self.sent = False  # whether the command went out (for the error's name of the call)

    def run(self, command: list[str], timeout: float) -> str:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            return self._run(command, timeout)
        except (BotoCoreError, ClientError) as error:
            what = "SSM " + ("GetCommandInvocation" if self.sent else "SendCommand")
            raise call_error(error, what, node=self.instance_id) from None

    def _run(self, command: list[str], timeout: float) -> str:
        self.sent = False
        document = self.documents.get(tuple(command))
        if document:
            sent = self.ssm.send_command(InstanceIds=[self.instance_id], DocumentName=document)
        else:
            sent = self.ssm.send_command(
                InstanceIds=[self.instance_id],
                DocumentName=RUN_SHELL_SCRIPT,
                Parameters={
                    "commands": [shlex.join(command)],
                    "executionTimeout": [str(int(timeout))],
                },
            )
        command_id = sent["Command"]["CommandId"]
        self.sent = True
        deadline = time.monotonic() + timeout + 60
        while True:
            self.sleep(2)
            try:
                result = self.ssm.get_command_invocation(
                    CommandId=command_id, InstanceId=self.instance_id
                )
            except self.ssm.exceptions.InvocationDoesNotExist:
                continue  # not registered yet
            if result["Status"] == "Success":
                return str(result["StandardOutputContent"])
            if result["Status"] in {"Failed", "Cancelled", "TimedOut", "Cancelling"}:
                raise ChannelError(
                    f"SSM {result['Status']} on {self.instance_id}: "
                    f"{result.get('StandardErrorContent', '').strip()[-500:]}"
                )
            if time.monotonic() > deadline:
                raise ChannelError(f"SSM command {command_id} still {result['Status']}")


# --- the audit ------------------------------------------------------------------------------------


def _leftovers(tagging: Any, ec2: Any, stack: str) -> list[str]:
    """Everything tagged with the stack (Resource Groups Tagging API), cross-checked with EC2:
    a terminated instance stays listed by tag for a while, and is not a leftover."""
    found: list[str] = []
    filters = [{"Key": "project", "Values": [PROJECT]}, {"Key": "stack", "Values": [stack]}]
    for page in tagging.get_paginator("get_resources").paginate(TagFilters=filters):
        found += [r["ResourceARN"] for r in page["ResourceTagMappingList"]]
    live = set()
    reservations = ec2.describe_instances(
        Filters=[
            {"Name": "tag:stack", "Values": [stack]},
            {"Name": "instance-state-name",
             "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]},
        ]
    )["Reservations"]  # fmt: skip
    for reservation in reservations:
        live |= {i["InstanceId"] for i in reservation["Instances"]}
    leftovers = [arn for arn in found if ":instance/" not in arn]
    leftovers += [arn for arn in found if ":instance/" in arn and arn.rsplit("/", 1)[1] in live]
    listed = {arn.rsplit("/", 1)[1] for arn in found}
    leftovers += [f"instance {i} (running, not yet in the tagging API)" for i in live - listed]
    return leftovers


# --- the object store -----------------------------------------------------------------------------


class S3Store:
    def __init__(self, s3: Any, bucket: str) -> None:
        self.s3, self.bucket = s3, bucket
        self.uploads: dict[str, str] = {}
        self.etags: dict[tuple[str, int], str] = {}
        self.lock = threading.Lock()

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def check_region(self, region: str) -> None:
        answer = self.s3.get_bucket_location(Bucket=self.bucket)
        location = answer.get("LocationConstraint") or "us-east-1"
        if location != region:
            raise StageError(
                f"bucket {self.bucket} is in {location}, the stack in {region}: the nodes reach "
                f"only their own region's buckets over the gateway endpoint; use a bucket in "
                f"{region}"
            )

    def have(self, key: str) -> str | None:
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=key)
        except self.s3.exceptions.ClientError as error:
            if error.response["Error"]["Code"] not in {"404", "NoSuchKey", "NotFound"}:
                raise StageError(f"{self.url(key)}: {error}") from None
            return None
        found = head.get("Metadata", {}).get(SHA256_METADATA)
        return str(found) if found else None

    def earlier(self, key: str) -> dict[int, Piece]:
        """The pieces of the newest unfinished upload of KEY.staging; a new upload if none."""
        staging = key + STAGING
        listed = self.s3.list_multipart_uploads(Bucket=self.bucket, Prefix=staging)
        mine = sorted(
            (u for u in listed.get("Uploads", []) if u["Key"] == staging),
            key=lambda u: u["Initiated"],
        )
        if not mine:
            self.uploads[key] = self.s3.create_multipart_upload(Bucket=self.bucket, Key=staging)[
                "UploadId"
            ]
            return {}
        self.uploads[key] = upload_id = mine[-1]["UploadId"]
        found: dict[int, Piece] = {}
        pages = self.s3.get_paginator("list_parts").paginate(
            Bucket=self.bucket, Key=staging, UploadId=upload_id
        )
        for page in pages:
            for part in page.get("Parts", []):
                self.etags[key, part["PartNumber"]] = part["ETag"]
                found[part["PartNumber"]] = Piece(part["Size"], part["ETag"].strip('"'))
        return found

    def put(self, key: str, number: int, data: bytes) -> None:
        answer = self.s3.upload_part(
            Bucket=self.bucket, Key=key + STAGING, UploadId=self.uploads[key],
            PartNumber=number, Body=data,
        )  # fmt: skip
        with self.lock:
            self.etags[key, number] = answer["ETag"]

    def finish(self, key: str, numbers: list[int], sha256: str) -> None:
        staging = key + STAGING
        parts = [{"PartNumber": n, "ETag": self.etags[key, n]} for n in numbers]
        self.s3.complete_multipart_upload(
            Bucket=self.bucket, Key=staging, UploadId=self.uploads[key],
            MultipartUpload={"Parts": parts},
        )  # fmt: skip
        from boto3.s3.transfer import TransferConfig  # noqa: PLC0415 (only AWS stacks need it)

        # Copied in the pieces it was uploaded in (64 MiB), not boto3's 8 MiB: a 50 GB part is
        # about 750 UploadPartCopy requests, not 6,000 (boto3 keeps any part within 10,000).
        pieces = TransferConfig(multipart_threshold=COPY_PIECE_BYTES,
                                multipart_chunksize=COPY_PIECE_BYTES)  # fmt: skip
        self.s3.copy(
            {"Bucket": self.bucket, "Key": staging}, self.bucket, key,
            ExtraArgs={"Metadata": {SHA256_METADATA: sha256}, "MetadataDirective": "REPLACE"},
            Config=pieces,
        )  # fmt: skip
        self.s3.delete_object(Bucket=self.bucket, Key=staging)

    def discard(self, key: str) -> None:
        self.s3.abort_multipart_upload(
            Bucket=self.bucket, Key=key + STAGING, UploadId=self.uploads[key]
        )


class Aws(LiveCloud):
    name = "aws"
    provider_settings = ("profile",)
    # EC2's instance states.
    stopped_states = frozenset({"stopping", "stopped"})
    store_name = "S3"
    store_credentials = "your AWS credentials (AWS_PROFILE)"
    sdk_packages = ("botocore", "boto3")

    def program_reader(self, settings: Mapping[str, Any]) -> Reader:
        return _reader(profile_of(settings))

    def cli_reader(self, access: Access) -> Reader:
        return _reader(profile_of(access.values))

    def credentials(self, access: Access) -> list[str]:
        from botocore.exceptions import BotoCoreError  # noqa: PLC0415

        try:
            return _credentials(session(access.region, profile_of(access.values)))
        except BotoCoreError as error:  # a profile that is not there, an SSO cache unreadable
            return [str(call_error(error, "AWS"))]

    def channels(
        self, stack_outputs: Mapping[str, Any], mains: list[str], access: Access
    ) -> list[Channel]:
        from botocore.exceptions import BotoCoreError  # noqa: PLC0415

        from infra.boot.metrics_command import read_command  # noqa: PLC0415

        try:
            if access.aws_clients is None and (missing := self.credentials(access)):
                raise CredentialsError(missing[0])
            ssm = client(access, "ssm")
        except BotoCoreError as error:  # a profile that is not there, no region
            raise call_error(error, "SSM") from None
        document = stack_outputs.get(keys.METRICS_DOCUMENT)
        reading = tuple(read_command(SsmChannel.max_output))
        documents = {reading: str(document)} if document else {}
        return [SsmChannel(ssm, main, documents=documents) for main in mains]

    def start(
        self,
        stack_outputs: Mapping[str, Any],  # noqa: ARG002 (the LiveCloud interface)
        ids: list[str],
        access: Access,
    ) -> list[str]:
        """EC2 StartInstances, once for every node; each node's state as EC2 then reports it."""
        try:
            answer = client(access, "ec2").start_instances(InstanceIds=ids)
        except Exception as error:  # noqa: BLE001 (botocore's errors, each said with its fix)
            raise power_error(error, "EC2 StartInstances") from None
        states = {i["InstanceId"]: i["CurrentState"]["Name"] for i in answer["StartingInstances"]}
        return [f"{node}: {states.get(node, 'not reported')}" for node in ids]

    def power_states(
        self,
        stack_outputs: Mapping[str, Any],  # noqa: ARG002 (the LiveCloud interface)
        ids: list[str],
        access: Access,
    ) -> dict[str, str]:
        """EC2 DescribeInstances: each instance's state name."""
        try:
            answer = client(access, "ec2").describe_instances(InstanceIds=ids)
        except Exception as error:  # noqa: BLE001 (botocore's errors, each said with its fix)
            raise power_error(error, "EC2 DescribeInstances") from None
        return {
            instance["InstanceId"]: instance["State"]["Name"]
            for reservation in answer["Reservations"]
            for instance in reservation["Instances"]
        }

    def leftovers(self, stack: str, access: Access) -> list[str]:
        return _leftovers(client(access, "resourcegroupstaggingapi"), client(access, "ec2"), stack)

    def check_bucket(self, bucket: str) -> None:
        """Any bucket name: S3 says whether it is there."""

    def open_store(self, bucket: str, *, region: str, endpoint: str | None) -> Store:
        """AWS's own credentials (``AWS_PROFILE``, ...); ``endpoint``: another S3 API."""
        return S3Store(client(Access(region), "s3", endpoint=endpoint), bucket)

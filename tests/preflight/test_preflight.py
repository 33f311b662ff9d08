"""The preflight against recorded API answers: AWS through botocore's Stubber (which checks every
request against EC2's and Service Quotas' models), Google Cloud and Azure through recorded JSON
(tests/fixtures/preflight). A short quota, an unoffered type and a missing Network Watcher are
refused, naming the fix, before the program registers anything."""

from __future__ import annotations

import copy
import datetime
import json
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import boto3
import pulumi
import pytest
from botocore.stub import Stubber

from infra import preflight
from infra.cli.check import main
from infra.clouds import azure as azure_facts
from infra.live import Access, LiveError, Reader, aws, azure, gcp, live_cloud
from infra.preflight.api import JsonApi
from tests.conftest import REPO
from tests.pulumi_mocks import SUBSCRIPTION, RecordingMocks, deploy, parsed_config

FIXTURES = REPO / "tests" / "fixtures" / "preflight"
P = "llama-rpc-cluster:"
CORS_CLOSED = ["--cors-origins", "https://chat.example.com"]  # a keyless stack needs it
STANDARD = "L-1216C47A"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def needs(stack: str, overrides: dict[str, Any] | None = None) -> preflight.Needs:
    return parsed_config(stack, overrides).needs(stack)


# --- AWS, through botocore's Stubber ------------------------------------------------------------


def aws_zone(name: str, opt_in: str = "opt-in-not-required", zone_id: str = "") -> dict[str, Any]:
    return {
        "State": "available",
        "OptInStatus": opt_in,
        "Messages": [],
        "RegionName": "us-east-1",
        "ZoneName": name,
        "ZoneId": zone_id or f"use1-{name[-1]}",
        "GroupName": "us-east-1-zg-1",
        "NetworkBorderGroup": "us-east-1",
        "ZoneType": "availability-zone",
    }


def aws_instance(instance_type: str, cores: int, tags: Mapping[str, str]) -> dict[str, Any]:
    return {
        "InstanceId": f"i-{abs(hash((instance_type, tuple(tags.items())))):017x}"[:19],
        "InstanceType": instance_type,
        "CpuOptions": {"CoreCount": cores, "ThreadsPerCore": 1},
        "State": {"Code": 16, "Name": "running"},
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        "Placement": {"AvailabilityZone": "us-east-1a"},
    }


class AwsAccount:
    """An EC2 and a Service Quotas client whose answers are recorded, each request checked."""

    def __init__(self) -> None:
        session = boto3.Session(
            aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x", region_name="us-east-1"
        )
        self.ec2 = session.client("ec2")
        self.quotas = session.client("service-quotas")
        self.ec2_stub, self.quota_stub = Stubber(self.ec2), Stubber(self.quotas)

    def zones(
        self,
        offers: Mapping[str, list[str]],
        types: list[str],
        ids: Mapping[str, str] | None = None,
    ) -> None:
        """The region's zones that need no opt-in (with their ``ids``, where given), and what
        each offers; a Local Zone that offers everything is listed among the offers only (it
        needs an opt-in)."""
        self.ec2_stub.add_response(
            "describe_availability_zones",
            {
                "AvailabilityZones": [
                    aws_zone(z, zone_id=(ids or {}).get(z, "")) for z in sorted(offers)
                ]
            },
            {
                "Filters": [
                    {"Name": "opt-in-status", "Values": ["opt-in-not-required"]},
                    {"Name": "zone-type", "Values": ["availability-zone"]},
                ]
            },
        )
        rows = [(z, t) for z, found in offers.items() for t in found]
        rows += [("us-east-1-bos-1a", t) for t in types]
        self.ec2_stub.add_response(
            "describe_instance_type_offerings",
            {
                "InstanceTypeOfferings": [
                    {"InstanceType": t, "LocationType": "availability-zone", "Location": z}
                    for z, t in rows
                ]
            },
            {
                "LocationType": "availability-zone",
                "Filters": [{"Name": "instance-type", "Values": types}],
            },
        )

    def running(self, *instances: dict[str, Any]) -> None:
        first = list(instances[:1])
        self.ec2_stub.add_response(
            "describe_instances",
            {"Reservations": [{"ReservationId": "r-1", "OwnerId": "1", "Instances": first}],
             "NextToken": "page-2"},
            {"Filters": [{"Name": "instance-state-name", "Values": ["pending", "running"]}]},
        )  # fmt: skip
        self.ec2_stub.add_response(
            "describe_instances",
            {"Reservations": [{"ReservationId": "r-2", "OwnerId": "1",
                               "Instances": list(instances[1:])}]},
            {"Filters": [{"Name": "instance-state-name", "Values": ["pending", "running"]}],
             "NextToken": "page-2"},
        )  # fmt: skip

    def quota(self, value: float | None) -> None:
        if value is None:
            self.quota_stub.add_client_error(
                "get_service_quota",
                service_error_code="AccessDeniedException",
                service_message="You do not have sufficient permission to perform this action.",
                http_status_code=400,
            )
            return
        self.quota_stub.add_response(
            "get_service_quota",
            {"Quota": {"ServiceCode": "ec2", "QuotaCode": STANDARD, "Value": value,
                       "QuotaName": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) "
                       "instances", "Unit": "None", "Adjustable": True, "GlobalQuota": False}},
            {"ServiceCode": "ec2", "QuotaCode": STANDARD},
        )  # fmt: skip

    volumes: list[dict[str, Any]] | None = None  # the stack's model volumes, as EC2 lists them
    modifications: list[dict[str, Any]] | None = None  # their last changes, when asked

    def model_volumes(self, wanted: preflight.Needs) -> None:
        """EC2's answers about the stack's model volumes (none: a first `up`)."""
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in wanted.tags.items()]
        filters.append({"Name": "tag:role", "Values": ["main"]})
        self.ec2_stub.add_response(
            "describe_volumes", {"Volumes": self.volumes or []}, {"Filters": filters}
        )
        if self.modifications is not None:
            ids = sorted(v["VolumeId"] for v in self.volumes or [])
            self.ec2_stub.add_response(
                "describe_volumes_modifications",
                {"VolumesModifications": self.modifications},
                {"VolumeIds": ids},
            )

    def read(self, wanted: preflight.Needs) -> preflight.Account:
        if wanted.model_disk_throughput is not None:
            self.model_volumes(wanted)
        with self.ec2_stub, self.quota_stub:
            account = aws.read_account(wanted, self.ec2, self.quotas)
            self.ec2_stub.assert_no_pending_responses()
            self.quota_stub.assert_no_pending_responses()
        return account


C8G = ["c8g.16xlarge"]
OTHER = {"team": "ci"}


def aws_account(
    quota: float | None,
    *others: dict[str, Any],
    offers: Mapping[str, list[str]] | None = None,
) -> AwsAccount:
    account = AwsAccount()
    account.zones(offers or {"us-east-1a": C8G, "us-east-1b": C8G, "us-east-1c": []}, C8G)
    account.running(aws_instance("t4g.small", 2, OTHER), *others)
    account.quota(quota)
    return account


def test_aws_a_ready_account_passes_and_picks_the_first_zone_that_needs_no_opt_in() -> None:
    wanted = needs("aws-c8g")
    account = aws_account(256.0).read(wanted)
    assert preflight.problems(wanted, account) == []
    assert preflight.zone_for(wanted, account) == "us-east-1a"  # not the Local Zone bos-1a
    [reading] = account.quotas
    assert (reading.limit, reading.used, reading.own) == (256.0, 2.0, 0.0)


def test_aws_a_new_accounts_quota_is_refused_with_the_request_to_send() -> None:
    wanted = needs("aws-c8g")
    [problem] = preflight.problems(wanted, aws_account(5.0).read(wanted))
    text = str(problem)
    assert text.startswith("quota: Running On-Demand Standard")
    assert (
        "(L-1216C47A) in us-east-1 is 5 vCPUs; the stack needs 192 vCPUs: 3 x c8g.16xlarge" in text
    )
    assert (
        "aws service-quotas request-service-quota-increase --region us-east-1 --service-code ec2 "
        "--quota-code L-1216C47A --desired-value 194" in text  # the t4g's 2 and the stack's 192
    )


def test_aws_every_replica_counts_and_other_instances_take_their_share() -> None:
    wanted = needs("aws-c8g", {f"{P}replicas": 2})
    # The balancer node (c8g.large) is asked for, and counted, with the groups.
    assert wanted.types == ("c8g.16xlarge", "c8g.large") and wanted.balancer == "c8g.large"
    both = list(wanted.types)
    account = AwsAccount()
    account.zones({"us-east-1a": both, "us-east-1b": both, "us-east-1c": []}, both)
    account.running(aws_instance("t4g.small", 2, OTHER), aws_instance("m7g.16xlarge", 64, OTHER))
    account.quota(400.0)
    [problem] = preflight.problems(wanted, account.read(wanted))
    assert "is 400 vCPUs and other instances use 66; the stack needs 386 vCPUs" in str(problem)
    assert "6 x c8g.16xlarge + 1 x c8g.large" in str(problem)
    assert "--desired-value 452" in str(problem)


def test_aws_the_balancer_nodes_type_must_be_offered_in_the_zone_too() -> None:
    wanted = needs("aws-c8g", {f"{P}replicas": 2})
    both = list(wanted.types)
    account = AwsAccount()
    account.zones({"us-east-1a": ["c8g.16xlarge"], "us-east-1b": both}, both)
    account.running(aws_instance("t4g.small", 2, OTHER))
    account.quota(512.0)
    read = account.read(wanted)
    assert preflight.problems(wanted, read) == []
    assert preflight.zone_for(wanted, read) == "us-east-1b"  # a lacks the balancer's type
    zoned = needs("aws-c8g", {f"{P}replicas": 2, f"{P}zone": "us-east-1a"})
    [problem] = preflight.problems(zoned, read)
    assert str(problem).startswith("zone: us-east-1a does not offer c8g.large")


def test_aws_a_second_up_does_not_count_the_stacks_own_nodes_twice() -> None:
    wanted = needs("aws-c8g")
    own = [aws_instance("c8g.16xlarge", 64, wanted.tags) for _ in range(3)]
    account = aws_account(200.0, *own).read(wanted)
    assert account.quotas[0].own == 192.0
    assert preflight.problems(wanted, account) == []


def test_aws_a_zone_setting_that_lacks_the_type_is_refused() -> None:
    wanted = needs("aws-c8g", {f"{P}zone": "us-east-1c"})
    [problem] = preflight.problems(wanted, aws_account(256.0).read(wanted))
    assert str(problem) == (
        "zone: us-east-1c does not offer c8g.16xlarge (zones that offer them: us-east-1a, "
        "us-east-1b); choose another zone, or remove the setting to let the program choose"
    )


def test_aws_no_zone_offering_both_types_is_refused() -> None:
    wanted = needs("aws-r8g")
    offers = {"us-east-1a": ["r8g.8xlarge"], "us-east-1b": ["r8g.4xlarge"]}
    account = AwsAccount()
    account.zones(offers, sorted(wanted.types))
    account.running(aws_instance("t4g.small", 2, OTHER))
    account.quota(512.0)
    [problem] = preflight.problems(wanted, account.read(wanted))
    assert str(problem).startswith("instanceType: no zone of us-east-1 offers")
    assert "r8g.4xlarge in us-east-1b; r8g.8xlarge in us-east-1a" in str(problem)


def eks_account(offers: Mapping[str, list[str]]) -> AwsAccount:
    """us-east-1a is use1-az3 in this account, a zone where EKS refuses a cluster's subnets."""
    account = AwsAccount()
    account.zones(offers, C8G, ids={"us-east-1a": "use1-az3"})
    account.running(aws_instance("t4g.small", 2, OTHER))
    account.quota(512.0)
    return account


def test_aws_eks_never_chooses_a_zone_eks_refuses_and_names_one_set() -> None:
    """The nodes' subnet is also one of the control plane's: its zone must be one EKS takes,
    told by zone id (names differ between accounts)."""
    wanted = needs("aws-eks")
    assert "use1-az3" in wanted.refused_zone_ids
    offers = {"us-east-1a": C8G, "us-east-1b": C8G}
    read = eks_account(offers).read(wanted)
    assert read.zone_ids == {"us-east-1a": "use1-az3", "us-east-1b": "use1-b"}
    assert preflight.problems(wanted, read) == []
    assert preflight.zone_for(wanted, read) == "us-east-1b"
    # VMs take any zone.
    vms = needs("aws-c8g")
    assert preflight.zone_for(vms, eks_account(offers).read(vms)) == "us-east-1a"
    zoned = needs("aws-eks", {f"{P}zone": "us-east-1a"})
    [problem] = preflight.problems(zoned, eks_account(offers).read(zoned))
    assert str(problem).startswith(
        "zone: us-east-1a is use1-az3 in this account, where EKS refuses a cluster's subnets"
    )
    assert "(us-east-1b offer the types)" in str(problem)
    only = eks_account({"us-east-1a": C8G, "us-east-1b": []}).read(wanted)
    [problem] = preflight.problems(wanted, only)
    assert str(problem).startswith(
        "instanceType: the zones of us-east-1 that offer c8g.16xlarge are use1-az3, where EKS"
    )
    assert preflight.zone_for(wanted, only) is None


def model_volume(throughput: int, tags: Mapping[str, str]) -> dict[str, Any]:
    return {
        "VolumeId": "vol-0123456789abcdef0",
        "Size": 311,
        "AvailabilityZone": "us-east-1a",
        "State": "in-use",
        "VolumeType": "gp3",
        "Iops": throughput * 4,
        "Throughput": throughput,
        "Encrypted": True,
        "Tags": [
            *({"Key": k, "Value": v} for k, v in tags.items()),
            {"Key": "role", "Value": "main"},
            {"Key": "Name", "Value": "llama-rpc-cluster-main-model"},
        ],
    }


@pytest.mark.parametrize("state", ["optimizing", "completed"])
def test_aws_a_new_throughput_waits_for_the_volumes_last_change_to_complete(state: str) -> None:
    """A throughput change is a ModifyVolume, which EC2 refuses until the volume's last one is
    completed (a 311 GiB volume may optimize for hours): two quick edits would stop `up`."""
    wanted = needs("aws-c8g", {f"{P}diskThroughputMibps": 1500})
    assert wanted.model_disk_throughput == 1500
    account = aws_account(256.0)
    account.volumes = [model_volume(2000, wanted.tags)]
    account.modifications = [
        {
            "VolumeId": "vol-0123456789abcdef0",
            "ModificationState": state,
            "TargetThroughput": 2000,
            "OriginalThroughput": 1000,
            "Progress": 40,
            "StartTime": datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC),
        }
    ]
    found = [str(p) for p in preflight.problems(wanted, account.read(wanted))]
    if state == "completed":
        assert found == []
        return
    [problem] = found
    assert problem.startswith(
        "diskThroughputMibps: the model volume vol-0123456789abcdef0 is still optimizing from a "
        "change started 2026-11-28 12:00 UTC, and EC2 takes another change of a volume only "
        "once the last is completed"
    )
    assert "keep diskThroughputMibps at 2000 until then" in problem


def test_aws_an_unchanged_throughput_asks_nothing_of_the_volumes_changes() -> None:
    wanted = needs("aws-c8g")
    account = aws_account(256.0)
    account.volumes = [model_volume(wanted.model_disk_throughput or 0, wanted.tags)]
    assert preflight.problems(wanted, account.read(wanted)) == []  # no modification asked


def test_aws_a_quota_it_may_not_read_is_said_not_checked_and_passes() -> None:
    wanted = needs("aws-c8g")
    account = aws_account(None).read(wanted)
    assert preflight.problems(wanted, account) == []
    [unread] = account.unread
    assert str(unread).startswith("the quota L-1216C47A was not checked: AccessDeniedException")


# --- Google Cloud and Azure, through recorded JSON ------------------------------------------------


class Recorded:
    """Answers GET requests from recorded bodies, by path and query; any other request fails
    the test, so the requests are checked too."""

    def __init__(self, answers: Mapping[str, Any]) -> None:
        self.answers = dict(answers)
        self.asked: list[str] = []

    def __call__(
        self, url: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> tuple[int, bytes]:
        assert headers["Authorization"] == "Bearer token"
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query)
        key = parts.path + ("?" + "&".join(f"{k}={v}" for k, v in sorted(query)) if query else "")
        if body is not None:  # a POST: the body is part of the question
            key = f"POST {key} {json.dumps(json.loads(body), sort_keys=True)}"
        self.asked.append(key)
        assert key in self.answers, f"unexpected request {key}"
        answer = self.answers[key]
        if isinstance(answer, tuple):
            status, body = answer
            return status, json.dumps(body).encode()
        return 200, json.dumps(answer).encode()


GCP = "/compute/v1/projects/my-project"
GCP_TYPES = 'name eq "(c4a-highcpu-72|c4a-standard-32)"'
GCP_PERMISSIONS = (
    "POST /v1/projects/my-project:testIamPermissions "
    '{"permissions": ["secretmanager.secrets.setIamPolicy"]}'
)
GCP_OWN = '(labels.project = "llama-rpc-cluster") AND (labels.stack = "gcp-c4a")'


def gcp_answers() -> dict[str, Any]:
    return {
        f"{GCP}/zones": fixture("gcp-zones.json"),
        f"{GCP}/aggregated/machineTypes?filter={GCP_TYPES}": fixture("gcp-machine-types.json"),
        f"{GCP}/regions/us-central1": fixture("gcp-region.json"),
        f"{GCP}/aggregated/instances?filter={GCP_OWN}": fixture("gcp-instances.json"),
        GCP: fixture("gcp-project.json"),
        GCP_PERMISSIONS: {"permissions": ["secretmanager.secrets.setIamPolicy"]},
    }


def gcp_read(wanted: preflight.Needs, answers: dict[str, Any]) -> preflight.Account:
    return gcp.read_account(wanted, JsonApi(gcp.BASE, "token", Recorded(answers)), "my-project")


def c4a_quota(answers: dict[str, Any], limit: float, usage: float) -> None:
    quotas = answers[f"{GCP}/regions/us-central1"]["quotas"]
    [entry] = [q for q in quotas if q["metric"] == "C4A_CPUS"]
    entry.update(limit=limit, usage=usage)


def test_gcp_a_ready_project_passes_in_the_first_zone_that_is_up_and_offers_both() -> None:
    wanted = needs("gcp-c4a")
    account = gcp_read(wanted, gcp_answers())
    assert preflight.problems(wanted, account) == []
    # a lacks the highcpu type; f is down; us-east1-b is another region's.
    assert account.zones_offering(wanted.types) == ["us-central1-b", "us-central1-c"]
    assert preflight.zone_for(wanted, account) == "us-central1-b"


def test_gcp_a_short_c4a_quota_is_refused_naming_the_quota_page() -> None:
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    c4a_quota(answers, 24.0, 0.0)
    [problem] = preflight.problems(wanted, gcp_read(wanted, answers))
    text = str(problem)
    assert "C4A CPUs (C4A_CPUS) in us-central1 is 24 vCPUs; the stack needs 176 vCPUs" in text
    assert "https://console.cloud.google.com/iam-admin/quotas?project=my-project" in text
    assert text.endswith("C4A_CPUS in us-central1, to 176")


def all_regions_quota(answers: dict[str, Any], limit: float, usage: float) -> None:
    [entry] = [q for q in answers[GCP]["quotas"] if q["metric"] == "CPUS_ALL_REGIONS"]
    entry.update(limit=limit, usage=usage)


def test_gcp_a_new_projects_cpus_in_all_regions_are_refused_as_well() -> None:
    """CPUS_ALL_REGIONS caps every family in every region: a trial project's 12 stop the stack
    after its network exists, whatever its region's C4A_CPUS says."""
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    all_regions_quota(answers, 12.0, 0.0)
    account = gcp_read(wanted, answers)
    assert [r.quota.id for r in account.quotas] == ["C4A_CPUS", "CPUS_ALL_REGIONS"]
    [problem] = preflight.problems(wanted, account)
    text = str(problem)
    assert text.startswith("quota: CPUs in all regions (CPUS_ALL_REGIONS) is 12 vCPUs; the ")
    assert (
        "the stack needs 176 vCPUs" in text
        and "in us-central1" not in text.split(".", maxsplit=1)[0]
    )
    assert text.endswith("CPUS_ALL_REGIONS (global), to 176")
    # Another region's VMs take their share of it too.
    all_regions_quota(answers, 200.0, 40.0)
    [problem] = preflight.problems(wanted, gcp_read(wanted, answers))
    assert "is 200 vCPUs and other instances use 40; the stack needs 176" in str(problem)
    all_regions_quota(answers, 400.0, 4.0)
    assert preflight.problems(wanted, gcp_read(wanted, answers)) == []


def test_gcp_a_project_quota_it_may_not_read_is_said_not_checked() -> None:
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    answers[GCP] = (403, {"error": {"code": 403, "message": "Required 'compute.projects.get'"}})
    account = gcp_read(wanted, answers)
    assert preflight.problems(wanted, account) == []
    [unread] = account.unread
    assert str(unread).startswith("the project's CPU quota in all regions was not checked: ")


def test_gcp_a_second_up_counts_its_own_running_nodes_once() -> None:
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    c4a_quota(answers, 180.0, 176.0 + 4.0)
    own = answers[f"{GCP}/aggregated/instances?filter={GCP_OWN}"]
    machine = "https://www.googleapis.com/compute/v1/projects/my-project/zones/us-central1-b/machineTypes/"
    own["items"]["zones/us-central1-b"] = {
        "instances": [
            {
                "name": f"n{i}",
                "machineType": machine + t,
                "status": "RUNNING",
                "labels": wanted.tags,
            }
            for i, t in enumerate(["c4a-highcpu-72", "c4a-highcpu-72", "c4a-standard-32"])
        ]
    }
    account = gcp_read(wanted, answers)
    assert account.quotas[0].own == 176.0
    assert preflight.problems(wanted, account) == []
    c4a_quota(answers, 178.0, 180.0)
    [problem] = preflight.problems(wanted, gcp_read(wanted, answers))
    assert "other instances use 4; the stack needs 176" in str(problem)


def test_gcp_a_quota_the_region_does_not_report_is_not_checked() -> None:
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    answers[f"{GCP}/regions/us-central1"]["quotas"] = []
    account = gcp_read(wanted, answers)
    assert preflight.problems(wanted, account) == []
    assert [str(u) for u in account.unread] == [
        "the quota C4A_CPUS was not checked: us-central1 reports none"
    ]


def test_gcp_a_denied_read_is_not_checked_but_zones_must_be_known() -> None:
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    denied = {
        "error": {
            "code": 403,
            "message": "Required 'compute.zones.list' permission for 'projects/my-project'",
            "errors": [{"message": "Required 'compute.zones.list' permission", "domain": "global",
                        "reason": "forbidden"}],
        }
    }  # fmt: skip
    answers[f"{GCP}/zones"] = (403, denied)
    account = gcp_read(wanted, answers)
    [problem] = preflight.problems(wanted, account)
    assert str(problem).startswith("zone: the program could not read which zones of us-central1")
    assert "HTTP 403 forbidden: Required 'compute.zones.list' permission" in str(problem)
    zoned = needs("gcp-c4a", {f"{P}zone": "us-central1-c"})
    assert preflight.problems(zoned, gcp_read(zoned, answers)) == []


AZURE = f"/subscriptions/{SUBSCRIPTION}/providers"
AZURE_PATHS = {
    "skus": f"{AZURE}/Microsoft.Compute/skus?$filter=location eq 'eastus'&api-version=2021-07-01",
    "usages": f"{AZURE}/Microsoft.Compute/locations/eastus/usages?api-version=2024-11-01",
    "vms": f"{AZURE}/Microsoft.Compute/virtualMachines?api-version=2024-11-01",
    "watchers": f"{AZURE}/Microsoft.Network/networkWatchers?api-version=2024-05-01",
    "insights": f"{AZURE}/Microsoft.Insights?api-version=2021-04-01",
    "keyvault": f"{AZURE}/Microsoft.KeyVault?api-version=2021-04-01",
    "groups": f"/subscriptions/{SUBSCRIPTION}/resourcegroups?$top=1&api-version=2021-04-01",
    "permissions": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/NetworkWatcherRG/providers/"
    "Microsoft.Authorization/permissions?api-version=2022-04-01",
}


def azure_answers() -> dict[str, Any]:
    return {path: fixture(f"azure-{name}.json") for name, path in AZURE_PATHS.items()}


def azure_read(wanted: preflight.Needs, answers: dict[str, Any]) -> preflight.Account:
    return azure.read_account(wanted, JsonApi(azure.BASE, "token", Recorded(answers)), SUBSCRIPTION)


def test_azure_a_ready_subscription_passes() -> None:
    wanted = needs("azure-cobalt")
    account = azure_read(wanted, azure_answers())
    assert preflight.problems(wanted, account) == []
    limits = {r.quota.id: (r.limit, r.used) for r in account.quotas}
    assert limits == {"standardDpsv6Family": (200.0, 0.0), "cores": (350.0, 8.0)}
    assert preflight.zone_for(wanted, account) is None  # Azure places nodes in no zone


def test_azure_a_short_family_quota_and_the_regional_total_are_refused() -> None:
    wanted = needs("azure-cobalt", {f"{P}replicas": 2})  # 320 vCPUs of Dpsv6, 2 of Dplsv6
    answers = azure_answers()
    [cores] = [u for u in answers[AZURE_PATHS["usages"]]["value"] if u["name"]["value"] == "cores"]
    cores["currentValue"] = 40
    found = [str(p) for p in preflight.problems(wanted, azure_read(wanted, answers))]
    assert len(found) == 2
    assert (
        "Standard DPSv6 Family vCPUs (standardDpsv6Family) in eastus is 200 vCPUs; the " in found[0]
    )
    # A family's quota counts its own sizes; the region's total, every node.
    assert "the stack needs 320 vCPUs: 2 x Standard_D32ps_v6 + 4 x Standard_D64ps_v6." in found[0]
    assert (
        "Total Regional vCPUs (cores) in eastus is 350 vCPUs and other instances use 40; the "
        "stack needs 322 vCPUs: 1 x Standard_D2pls_v6 + 2 x Standard_D32ps_v6 + 4 x "
        "Standard_D64ps_v6." in found[1]
    )
    assert "portal.azure.com" in found[0] and "az vm list-usage --location eastus" in found[0]


def test_azure_the_balancer_nodes_own_family_quota_and_size_are_read() -> None:
    """The balancer node (Standard_D2pls_v6) draws on the Dplsv6 family, a quota of its own
    that new subscriptions may hold at 0."""
    wanted = needs("azure-cobalt", {f"{P}replicas": 2})
    answers = azure_answers()
    usages = {u["name"]["value"]: u for u in answers[AZURE_PATHS["usages"]]["value"]}
    usages["standardDPSv6Family"]["limit"] = 400  # room for the groups
    family = usages["standardDPLSv6Family"]
    family["limit"] = 0
    [problem] = preflight.problems(wanted, azure_read(wanted, answers))
    assert str(problem).startswith(
        "quota: Standard DPLSv6 Family vCPUs (standardDplsv6Family) in eastus is 0 vCPUs; the "
        "stack needs 2 vCPUs: 1 x Standard_D2pls_v6."
    )
    family["limit"] = 10
    [sku] = [s for s in answers[AZURE_PATHS["skus"]]["value"] if s["name"] == "Standard_D2pls_v6"]
    sku["restrictions"] = [
        {"type": "Location", "values": ["eastus"], "reasonCode": "NotAvailableForSubscription"}
    ]
    [problem] = preflight.problems(wanted, azure_read(wanted, answers))
    assert str(problem) == (
        "replicas: Standard_D2pls_v6, the balancer node's size (with replicas above 1): not "
        "available to this subscription in eastus (NotAvailableForSubscription); choose another "
        "region, or one serving group"
    )
    assert needs("azure-cobalt").balancer is None  # one group: no balancer node


def test_azure_a_size_the_subscription_may_not_have_is_refused() -> None:
    wanted = needs("azure-cobalt", {f"{P}instanceType": "Standard_E96ps_v6"})
    found = preflight.problems(wanted, azure_read(wanted, azure_answers()))
    assert [str(p) for p in found] == [
        "instanceType: Standard_E96ps_v6: not available to this subscription in eastus "
        "(NotAvailableForSubscription); choose another size or region"
    ]


def test_azure_a_missing_network_watcher_is_refused_with_the_command_to_make_one() -> None:
    wanted = needs("azure-cobalt")
    answers = azure_answers()
    answers[AZURE_PATHS["watchers"]]["value"] = [
        w for w in answers[AZURE_PATHS["watchers"]]["value"] if w["location"] != "eastus"
    ]
    [problem] = preflight.problems(wanted, azure_read(wanted, answers))
    assert str(problem).startswith("networkWatcher: the subscription has no Network Watcher")
    assert (
        "az network watcher configure --resource-group NetworkWatcherRG --locations eastus"
        in str(problem)
    )
    assert "or set flowLogs to false" in str(problem)
    # Without flow logs, no watcher is asked for.
    off = needs("azure-cobalt", {f"{P}flowLogs": False})
    answers.pop(AZURE_PATHS["watchers"]), answers.pop(AZURE_PATHS["insights"])
    assert preflight.problems(off, azure_read(off, answers)) == []


def test_azure_a_watcher_elsewhere_and_an_unregistered_insights_are_named() -> None:
    wanted = needs("azure-cobalt")
    answers = azure_answers()
    [eastus] = [w for w in answers[AZURE_PATHS["watchers"]]["value"] if w["location"] == "eastus"]
    eastus.update(
        name="nw-east",
        id=eastus["id"]
        .replace("NetworkWatcherRG", "ops-rg")
        .replace("NetworkWatcher_eastus", "nw-east"),
    )
    answers[AZURE_PATHS["insights"]]["registrationState"] = "NotRegistered"
    found = [str(p) for p in preflight.problems(wanted, azure_read(wanted, answers))]
    assert found == [
        "networkWatcher: the region's Network Watcher is ops-rg/nw-east (one per region and "
        "subscription), not NetworkWatcherRG/NetworkWatcher_eastus; set it with `pulumi config "
        "set networkWatcher ops-rg/nw-east`",
        "flowLogs: the subscription has not registered Microsoft.Insights, which flow logs need: "
        "`az provider register --namespace Microsoft.Insights` (it takes a few minutes), or set "
        "flowLogs to false",
    ]
    named = needs("azure-cobalt", {f"{P}networkWatcher": "ops-rg/nw-east"})
    assert len(preflight.problems(named, azure_read(named, answers))) == 1


def test_azure_an_unregistered_key_vault_provider_is_named_unless_the_stack_has_no_key() -> None:
    wanted = needs("azure-cobalt")
    assert wanted.key_vault  # a key by default, in the stack's own vault
    answers = azure_answers()
    answers[AZURE_PATHS["keyvault"]]["registrationState"] = "NotRegistered"
    found = [str(p) for p in preflight.problems(wanted, azure_read(wanted, answers))]
    assert found == [
        "apiKey: the subscription has not registered Microsoft.KeyVault, whose vault keeps the "
        "stack's API key: `az provider register --namespace Microsoft.KeyVault` (it takes a few "
        "minutes), or set apiKey to none with --cors-origins in serverArgs"
    ]
    keyless = needs(
        "azure-cobalt",
        {f"{P}apiKey": "none", f"{P}serverArgs": CORS_CLOSED},
    )
    assert not keyless.key_vault
    answers.pop(AZURE_PATHS["keyvault"])  # not even asked
    assert preflight.problems(keyless, azure_read(keyless, answers)) == []


def test_azure_the_stacks_own_vms_are_told_apart_by_their_tags() -> None:
    wanted = needs("azure-cobalt")
    answers = azure_answers()
    usages = answers[AZURE_PATHS["usages"]]["value"]
    for usage in usages:
        if usage["name"]["value"] in ("standardDPSv6Family", "cores"):
            usage["currentValue"] += 160
    vm = copy.deepcopy(answers[AZURE_PATHS["vms"]]["value"][0])
    answers[AZURE_PATHS["vms"]]["value"] += [
        {**vm, "name": f"n{i}", "tags": dict(wanted.tags),
         "properties": {"hardwareProfile": {"vmSize": size}}}
        for i, size in enumerate(["Standard_D64ps_v6", "Standard_D64ps_v6", "Standard_D32ps_v6"])
    ]  # fmt: skip
    account = azure_read(wanted, answers)
    assert {r.quota.id: r.own for r in account.quotas} == {
        "standardDpsv6Family": 160.0,
        "cores": 160.0,
    }
    assert preflight.problems(wanted, account) == []


# --- where a user meets it: pulumi up, and the command -------------------------------------------


def recorded_reader(answers: Callable[[], dict[str, Any]]) -> Reader:
    def read(wanted: preflight.Needs) -> preflight.Account:
        if wanted.cloud == "gcp":
            return gcp_read(wanted, answers())
        return azure_read(wanted, answers())

    return read


def test_pulumi_up_stops_before_creating_anything_on_a_short_quota() -> None:
    answers = gcp_answers()
    c4a_quota(answers, 24.0, 0.0)
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as error:
        deploy("gcp-c4a", mocks=mocks, account=recorded_reader(lambda: answers))
    assert "the cloud account is not ready for this stack, and nothing was created" in str(
        error.value
    )
    assert "C4A_CPUS" in str(error.value)
    assert mocks.resources == []


def test_pulumi_up_stops_before_creating_anything_without_a_network_watcher() -> None:
    answers = azure_answers()
    answers[AZURE_PATHS["watchers"]]["value"] = []
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="no Network Watcher in eastus"):
        deploy("azure-cobalt", mocks=mocks, account=recorded_reader(lambda: answers))
    assert mocks.resources == []


def test_pulumi_up_creates_the_nodes_in_the_zone_the_preflight_chose() -> None:
    d = deploy("gcp-c4a", account=recorded_reader(gcp_answers))
    zones = {
        r.inputs["zone"] for r in d.resources if r.typ == "gcp:compute/instanceGroup:InstanceGroup"
    }
    assert zones == {"us-central1-b"}


def test_the_command_says_ready_or_names_each_problem(capsys: pytest.CaptureFixture[str]) -> None:
    def factory(cloud: str, access: Access) -> Reader:
        assert cloud == "gcp" and access.values["gcp:region"] == "us-central1"
        assert access.region == "us-central1"
        return recorded_reader(answers)

    answers = gcp_answers
    assert main(["--stack", "gcp-c4a"], reader_for=factory) == 0
    out = capsys.readouterr().out
    assert "zone: us-central1-b (the first that offers every type" in out
    assert "quota C4A CPUs (C4A_CPUS): 200 vCPUs, 0 in use, 0 of them this stack's" in out
    assert out.rstrip().endswith("ready: the account has what the stack needs")

    def short() -> dict[str, Any]:
        found = gcp_answers()
        c4a_quota(found, 24.0, 0.0)
        return found

    answers = short
    assert main(["--stack", "gcp-c4a", "--json"], reader_for=factory) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ready"] is False and report["zone"] == "us-central1-b"
    assert report["schemaVersion"] == 1
    [problem] = report["problems"]
    assert problem["about"] == "quota" and "24 vCPUs" in problem["message"]


def test_the_command_names_a_missing_stack_and_a_bad_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--stack", "no-such-stack"]) == 2
    assert "stack 'no-such-stack': no stacks/Pulumi.no-such-stack.yaml" in capsys.readouterr().err


def test_a_cloud_without_a_reader_is_refused_not_read_as_another(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(LiveError, match="no live operations for cloud 'oci'"):
        live_cloud("oci")
    assert main(["--stack", "gcp-c4a"], reader_for=lambda cloud, access: live_cloud("oci")) == 2
    assert "preflight: no live operations for cloud 'oci'" in capsys.readouterr().err


# --- the deployer's own permissions, through each cloud's permission check ----------------------


def test_gcp_an_editor_who_may_not_bind_the_secret_is_refused_naming_the_role() -> None:
    """The API key's secret is bound to the main nodes' account with setIamPolicy, which the
    basic Editor role lacks: without it the stack stops after its nodes exist."""
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    assert preflight.problems(wanted, gcp_read(wanted, answers)) == []
    answers[GCP_PERMISSIONS] = {}  # Google leaves out what the caller does not hold
    [problem] = preflight.problems(wanted, gcp_read(wanted, answers))
    assert str(problem) == (
        "apiKey: your identity may not secretmanager.secrets.setIamPolicy, which the main "
        "nodes' read of the API key's secret needs: ask for Secret Manager Admin "
        "(roles/secretmanager.admin) or Owner on the project (Editor cannot set IAM "
        "policies), or set apiKey to none with --cors-origins in serverArgs"
    )
    keyless = needs("gcp-c4a", {f"{P}apiKey": "none", f"{P}serverArgs": CORS_CLOSED})
    answers.pop(GCP_PERMISSIONS)  # not even asked
    assert preflight.problems(keyless, gcp_read(keyless, answers)) == []


def test_gcp_permissions_it_may_not_test_are_said_not_checked() -> None:
    wanted = needs("gcp-c4a")
    answers = gcp_answers()
    answers[GCP_PERMISSIONS] = (403, {"error": {"code": 403, "message": "recorded"}})
    account = gcp_read(wanted, answers)
    assert preflight.problems(wanted, account) == []
    assert [str(u) for u in account.unread] == [
        "your permissions was not checked: /v1/projects/my-project:testIamPermissions: HTTP 403 "
        "403: recorded"
    ]


def contributor_only(answers: dict[str, Any]) -> None:
    """The caller holds Contributor alone: everything but Microsoft.Authorization's writes."""
    sets = answers[AZURE_PATHS["permissions"]]["value"]
    answers[AZURE_PATHS["permissions"]]["value"] = [s for s in sets if s["actions"] == ["*"]]


def test_azure_a_contributor_who_may_not_assign_roles_is_refused_before_anything() -> None:
    """Every keyed stack grants its main nodes the secret's read: a Contributor-only deployer
    failed half-way (AuthorizationFailed on roleAssignments/write), after the VMs existed."""
    wanted = needs("azure-cobalt")
    answers = azure_answers()
    assert preflight.problems(wanted, azure_read(wanted, answers)) == []
    contributor_only(answers)
    [problem] = preflight.problems(wanted, azure_read(wanted, answers))
    assert str(problem) == (
        "apiKey: your identity may not Microsoft.Authorization/roleAssignments/write, which the "
        "main node's read of the API key's secret needs: ask for Role Based Access Control "
        "Administrator, User Access Administrator or Owner on the subscription (Contributor "
        "cannot assign roles), or set apiKey to none with --cors-origins in serverArgs"
    )
    keyless = needs("azure-cobalt", {f"{P}apiKey": "none", f"{P}serverArgs": CORS_CLOSED})
    assert keyless.rights == ()
    answers.pop(AZURE_PATHS["groups"]), answers.pop(AZURE_PATHS["permissions"])  # not asked
    assert preflight.problems(keyless, azure_read(keyless, answers)) == []


def test_azure_a_spend_guards_custom_role_needs_more_than_assigning_roles() -> None:
    wanted = needs("azure-cobalt", {f"{P}stopAfterHours": 8})
    found = [str(p) for p in preflight.problems(wanted, azure_read(wanted, azure_answers()))]
    assert found == [
        "stopAfterHours: your identity may not Microsoft.Authorization/roleDefinitions/write, "
        "which the spend guard's custom role needs: ask for User Access Administrator or Owner "
        "on the subscription, or remove the spend guard"
    ]


def test_azure_wildcards_match_as_rbac_matches_them() -> None:
    owner = [(["*"], [])]
    contributor = [(["*"], ["Microsoft.Authorization/*/Write"])]
    assert azure_facts.permits(owner, azure_facts.ROLE_ASSIGNMENT_WRITE)
    assert not azure_facts.permits(contributor, azure_facts.ROLE_ASSIGNMENT_WRITE)
    assert azure_facts.permits(
        [*contributor, (["microsoft.authorization/roleassignments/*"], [])],
        azure_facts.ROLE_ASSIGNMENT_WRITE,
    )

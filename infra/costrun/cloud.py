"""A cloud stack as a cost-run target: the Automation API deploys and destroys the project's own
program and stack file; the provider's command channel reads the main node and runs the
benchmark (AWS SSM ``send_command``, GCP IAP SSH, Azure Run Command); the audit asks the
provider for anything still tagged or labelled with the stack."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

from infra.catalog import InstanceType
from infra.clouds import gcp as gcp_facts
from infra.core.layout import PROJECT
from infra.costrun.channel_probe import ChannelProbe
from infra.costrun.rpc_bytes import ActivationShape
from infra.costrun.target import Prediction, StepError, parse_status
from infra.models import Model
from infra.observe.channels import Channel, ChannelError, Runner, run_cli, stack_channels
from infra.observe.status import STATUS_COMMAND
from infra.stack.config import ClusterConfig
from infra.stack.files import REPO, stack_config, stack_values


def aws_leftovers(tagging: Any, ec2: Any, stack: str) -> list[str]:
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


def gcp_leftovers(project: str, stack: str, runner: Runner = run_cli) -> list[str]:
    """Instances, disks and addresses labelled with the stack (networks and firewall rules carry
    no labels; they go with the stack's destroy, which the audit follows)."""
    leftovers = []
    for kind in ("instances", "disks", "addresses"):
        result = runner([
            "gcloud", "compute", kind, "list", "--project", project,
            f"--filter=labels.stack={gcp_facts.label_value(stack)} AND labels.project={PROJECT}",
            "--format=json",
        ])  # fmt: skip
        if result.returncode != 0:
            raise StepError(f"gcloud compute {kind} list: {result.stderr.strip()[-300:]}")
        leftovers += [f"{kind[:-1]} {item['name']}" for item in json.loads(result.stdout or "[]")]
    return leftovers


def azure_leftovers(stack: str, runner: Runner = run_cli) -> list[str]:
    """Resource groups and resources tagged with the stack."""
    leftovers = []
    for kind in ("group", "resource"):
        result = runner([
            "az", kind, "list", "--tag", f"stack={stack}", "--output", "json",
        ])  # fmt: skip
        if result.returncode != 0:
            raise StepError(f"az {kind} list: {result.stderr.strip()[-300:]}")
        for item in json.loads(result.stdout or "[]"):
            if item.get("tags", {}).get("project") == PROJECT:
                leftovers.append(f"{kind} {item['name']}")
    return leftovers


class PulumiTarget:
    """A stack from ``stacks/``, deployed with the Automation API."""

    def __init__(
        self,
        stack: str,
        *,
        automation: Any = None,
        aws_clients: Callable[[str, str], Any] | None = None,
        runner: Runner = run_cli,
        which: Callable[[str], str | None] = shutil.which,
        environ: dict[str, str] | None = None,
        pulumi_output: Callable[[str], None] | None = None,
    ) -> None:
        self.name = stack
        # Pulumi's own lines, as `pulumi up` prints them: a long up or destroy is not silent.
        self.pulumi_output = pulumi_output or self._echo
        self.config: ClusterConfig = stack_config(stack)
        self.provider = self.config.cloud
        self.values = stack_values(stack)
        self._automation = automation
        self._aws_clients = aws_clients
        self.runner, self.which = runner, which
        self.environ = os.environ if environ is None else environ
        self._stack: Any = None
        self.outputs: dict[str, Any] = {}

    def _echo(self, line: str) -> None:
        if line.strip():
            print(f"  {self.name} | {line.rstrip()}", file=sys.stderr)

    # --- what the run reports and predicts ---------------------------------------------------

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
            "provider": c.cloud,
            "region": c.region,
            "nodes": {
                "main": c.main_instance_type.name,
                "workers": c.worker_count,
                "worker": c.instance_type.name,
            },
            "llama_cpp_commit": c.llama_cpp_commit,
            "model": c.model.name,
            **({"draft_model": c.draft.name} if c.draft else {}),
        }

    def predict(self) -> Prediction:
        from infra.core import (  # noqa: PLC0415
            costs,
            perf,
            sizing,
        )
        from infra.planner import serve  # noqa: PLC0415

        c = self.config
        cost = c.hourly_cost
        nodes = [c.main_instance_type] + [c.instance_type] * c.worker_count
        disk = sizing.main_disk_read_mibps(
            c.main_instance_type, c.main_disk_gb, c.disk_throughput_mibps, c.model.size_bytes
        )
        staged = c.boots(0)[0].staged  # the main node reads the model
        timeline = serve.time_to_serve(
            c.model,
            c.main_instance_type,
            c.placement,
            disk,
            path="staged" if staged else "internet",
        )
        kv_tokens = int(c.context_size * perf.KV_FILL_FRACTION)
        decode_tps = perf.decode_tps(c.model, nodes, c.placement, kv_tokens)
        acceptance, draft_basis = None, ""
        if c.draft is not None:
            decode_tps, acceptance, draft_basis = self._with_draft(
                c.draft, nodes, kv_tokens, decode_tps
            )
        # The phases as the status file times them: the download includes the sha256 check,
        # and the build runs beside it.
        return Prediction(
            hourly_usd=cost.total,
            serve_seconds={
                "boot": round(timeline.seconds("boot"), 1),
                "build": round(timeline.seconds("build"), 1),
                "download": round(timeline.seconds("download") + timeline.seconds("verify"), 1),
                "load": round(timeline.seconds("load"), 1),
                "total": round(timeline.total_seconds, 1),
            },
            decode_tps=decode_tps,
            draft_acceptance=acceptance,
            draft_basis=draft_basis,
            # Each group's main node downloads the model through the NAT, unless it is staged.
            one_off_usd=0.0
            if staged
            else (costs.download_usd(c.cloud, c.model.size_bytes) or 0.0) * c.replicas,
            price_source="; ".join(cost.sources),
            unpriced=tuple(cost.unpriced),
            note=cost.basis,
        )

    def _with_draft(
        self, draft: Model, nodes: list[InstanceType], kv_tokens: int, plain_tps: float | None
    ) -> tuple[float | None, float | None, str]:
        """Decode with the stack's draft model, at the acceptance published for its pair (the
        planner's, ``lrc plan --engines``): the figure, the acceptance, and its basis. A draft
        with no published figure leaves decode predicted without it, and says so."""
        from infra.planner import engines  # noqa: PLC0415

        c = self.config
        pair = engines.draft_pair(c.model)
        if pair is None or pair.draft != draft.name:
            return (
                plain_tps,
                None,
                (
                    f"no published acceptance for {draft.name} drafting for {c.model.name}: "
                    "decode is predicted without the draft"
                ),
            )
        found = engines.speculative(
            c.model, nodes, c.placement, kv_tokens,
            draft=draft, acceptance=pair.acceptance, draft_max=c.draft_max,
        )  # fmt: skip
        if found is None:
            return plain_tps, None, "a bandwidth is unknown: decode is predicted without the draft"
        return (
            found.tps,
            pair.acceptance,
            (
                f"{pair.acceptance:.1%} accepted at draft {pair.draft_max} (draftMax "
                f"{c.draft_max} here): {pair.source}"
            ),
        )

    # --- preflight -----------------------------------------------------------------------------

    def preflight(self) -> list[str]:
        missing = []
        if self.which("pulumi") is None:
            missing.append(
                "the Pulumi CLI is not on PATH (the Automation API drives it): install it from "
                "https://www.pulumi.com/docs/install/"
            )
        missing += getattr(self, f"_preflight_{self.provider}")()
        return missing

    def _preflight_aws(self) -> list[str]:
        import boto3  # noqa: PLC0415

        if boto3.Session(region_name=self.config.region).get_credentials() is None:
            return [
                "no AWS credentials: set AWS_PROFILE (after `aws sso login`) or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            ]
        return []

    def _preflight_gcp(self) -> list[str]:
        missing = []
        if self.which("gcloud") is None:
            return ["gcloud is not on PATH: install the Google Cloud CLI (IAP SSH and the audit)"]
        accounts = self.runner(
            ["gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"]
        )
        if accounts.returncode != 0 or not accounts.stdout.strip():
            missing.append("no active gcloud account: run `gcloud auth login`")
        if not self.gcp_project:
            missing.append(
                "no GCP project: set `gcp:project` in the stack file or GOOGLE_CLOUD_PROJECT"
            )
        return missing

    def _preflight_azure(self) -> list[str]:
        if self.which("az") is None:
            return ["az is not on PATH: install the Azure CLI (Run Command and the audit)"]
        if self.runner(["az", "account", "show", "--output", "json"]).returncode != 0:
            return ["no Azure login: run `az login` (and `az account set --subscription ...`)"]
        return []

    @property
    def gcp_project(self) -> str:
        return str(self.values.get("gcp:project") or self.environ.get("GOOGLE_CLOUD_PROJECT", ""))

    # --- deploy, read, destroy -----------------------------------------------------------------

    @property
    def automation(self) -> Any:
        if self._automation is None:
            from pulumi import automation  # noqa: PLC0415

            self._automation = automation
        return self._automation

    def _pulumi_stack(self) -> Any:
        if self._stack is None:
            self._stack = self.automation.create_or_select_stack(
                stack_name=self.name, work_dir=str(REPO)
            )
        return self._stack

    def up(self) -> dict[str, Any]:
        try:
            result = self._pulumi_stack().up(on_output=self.pulumi_output)
        except Exception as error:  # noqa: BLE001 (the Automation API raises many kinds: each is a failed step)
            raise StepError(f"pulumi up {self.name} failed: {error}") from None
        self.outputs = {key: item.value for key, item in result.outputs.items()}
        return self.outputs

    def channel(self) -> Channel:
        """The first serving group's main node, where the benchmark runs."""
        try:
            return stack_channels(
                self.outputs,
                aws_ssm=lambda: self._client("ssm"),
                gcp_project=self.gcp_project,
                runner=self.runner,
            )[0]
        except ChannelError as error:
            raise StepError(str(error)) from None

    def _run(self, command: list[str], timeout: float) -> str:
        try:
            return self.channel().run(command, timeout)
        except ChannelError as error:
            raise StepError(str(error)) from None

    def _client(self, service: str) -> Any:
        if self._aws_clients is not None:
            return self._aws_clients(service, self.config.region)
        import boto3  # noqa: PLC0415

        return boto3.client(service, region_name=self.config.region)  # type: ignore[call-overload]

    def node_status(self) -> dict[str, Any]:
        return parse_status(self._run(STATUS_COMMAND, timeout=120))

    def run_on_main(self, command: list[str], timeout: float) -> str:
        return self._run(command, timeout)

    def usage_probe(self) -> ChannelProbe:
        """The first serving group, read by its main node through the command channel."""
        return ChannelProbe(self.channel(), self.outputs)

    def activation_shape(self) -> ActivationShape | None:
        return None

    def destroy(self) -> None:
        try:
            self._pulumi_stack().destroy(on_output=self.pulumi_output)
        except Exception as error:  # noqa: BLE001 (the Automation API raises many kinds: each is a failed step)
            raise StepError(f"pulumi destroy {self.name} failed: {error}") from None

    def leftovers(self) -> list[str]:
        if self.provider == "aws":
            return aws_leftovers(
                self._client("resourcegroupstaggingapi"), self._client("ec2"), self.name
            )
        if self.provider == "gcp":
            return gcp_leftovers(self.gcp_project, self.name, self.runner)
        if self.provider == "azure":
            return azure_leftovers(self.name, self.runner)
        raise StepError(f"no audit for {self.provider}: its leftovers cannot be looked for")

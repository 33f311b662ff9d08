"""A cloud stack as a cost-run target: the Automation API deploys and destroys the project's own
program and stack file; the cloud's command channel reads the main node and runs the benchmark,
and its audit asks for anything still tagged or labelled with the stack (``infra.live``)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

from infra.boot import metrics_command
from infra.catalog import InstanceType
from infra.costrun.channel_probe import ChannelProbe
from infra.costrun.rpc_bytes import ActivationShape
from infra.costrun.target import Prediction, StepError, parse_status
from infra.live import Access, Channel, LiveError, Runner, live_cloud, run_cli, stack_channels
from infra.models import Model
from infra.observe.status import STATUS_COMMAND
from infra.stack.config import ClusterConfig
from infra.stack.files import REPO, stack_config, stack_values


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
        self.live = live_cloud(self.provider)
        # The user's own way into the account, as `lrc status` and `lrc check` have it.
        self.access = Access(
            self.config.region,
            stack_values(stack),
            environ=os.environ if environ is None else environ,
            runner=runner,
            which=which,
            aws_clients=aws_clients,
        )
        self.which = which
        self._automation = automation
        self._stack: Any = None
        self.outputs: dict[str, Any] = {}
        self._channel: Channel | None = None
        self._channel_for: dict[str, Any] | None = None

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
        from infra.planner import search, serve  # noqa: PLC0415

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
        prompt = perf.prompt(c.model, nodes, c.placement, metrics_command.BENCH_PROMPT_TOKENS,
                             workers_repack=search.workers_repack())  # fmt: skip
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
            prompt_tokens=metrics_command.BENCH_PROMPT_TOKENS,
            prompt_tps=None if prompt is None else round(prompt.tps, 2),
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
        from infra.planner import engines, search  # noqa: PLC0415

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
            draft=draft, acceptance=pair.per_token, draft_max=c.draft_max,
            workers_repack=search.workers_repack(),
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
        missing += self.live.credentials(self.access)
        return missing

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
        """The first serving group's main node, where the benchmark runs (made once for the
        outputs of the last ``up``: making it checks the CLI's login)."""
        if self._channel is None or self._channel_for is not self.outputs:
            try:
                self._channel = stack_channels(self.outputs, access=self.access)[0]
            except LiveError as error:
                raise StepError(str(error)) from None
            self._channel_for = self.outputs
        return self._channel

    def _run(self, command: list[str], timeout: float) -> str:
        try:
            return self.channel().run(command, timeout)
        except LiveError as error:
            raise StepError(str(error)) from None

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
        try:
            return self.live.leftovers(self.name, self.access)
        except LiveError as error:
            raise StepError(str(error)) from None

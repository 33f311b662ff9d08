"""What a cost run needs of a deployment, whatever runs it: the local cluster or a cloud stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from infra.costrun.rpc_bytes import ActivationShape
from infra.observe.status import StatusError
from infra.observe.status import parse_status as read_status
from infra.observe.usage import UsageProbe


def parse_status(text: str) -> dict[str, Any]:
    """A node's status (``infra.observe.status``); a file not readable yet fails the step."""
    try:
        return read_status(text)
    except StatusError as error:
        raise StepError(str(error)) from None


class StepError(RuntimeError):
    """A step of a stack's cost run failed; the message says what and what to do."""


@dataclass(frozen=True)
class Prediction:
    """The planner's figures for a stack, to set beside the measured ones."""

    hourly_usd: float | None
    serve_seconds: dict[str, float] = field(default_factory=dict)  # phase: seconds, and "total"
    decode_tps: float | None = None
    # With a draft model: the share of drafted tokens the decode figure assumes accepted, and
    # where that figure comes from (or why decode is predicted without the draft).
    draft_acceptance: float | None = None
    draft_basis: str = ""
    # A prompt of ``prompt_tokens`` through the cluster (llama-rpc-bench's llama-bench prompt):
    # its rate, and so the seconds to its first generated token.
    prompt_tokens: int | None = None
    prompt_tps: float | None = None
    one_off_usd: float = 0.0  # e.g. the model's download through a NAT gateway
    price_source: str = ""
    unpriced: tuple[str, ...] = ()
    note: str = ""

    @property
    def first_token_seconds(self) -> float | None:
        if self.prompt_tokens is None or not self.prompt_tps:
            return None
        return round(self.prompt_tokens / self.prompt_tps, 3)

    def to_json(self) -> dict[str, Any]:
        return {
            "hourly_usd": self.hourly_usd,
            "serve_seconds": self.serve_seconds,
            "decode_tps": self.decode_tps,
            "draft_acceptance": self.draft_acceptance,
            "draft_basis": self.draft_basis,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tps": self.prompt_tps,
            "first_token_seconds": self.first_token_seconds,
            "one_off_usd": self.one_off_usd,
            "price_source": self.price_source,
            "unpriced": list(self.unpriced),
            "note": self.note,
        }


class Target(Protocol):
    """One stack under test. Every method may raise ``StepError``."""

    name: str
    provider: str  # "aws", "gcp", "azure" or "local"

    def describe(self) -> dict[str, Any]:
        """Instance types and counts, llama.cpp commit, region: for the report."""
        ...

    def predict(self) -> Prediction: ...

    def preflight(self) -> list[str]:
        """What is missing to run this stack (credentials, tools), each a sentence; [] if none."""
        ...

    def up(self) -> dict[str, Any]:
        """Deploy; the stack's outputs."""
        ...

    def node_status(self) -> dict[str, Any]:
        """The main node's status file, read through the provider's command channel."""
        ...

    def run_on_main(self, command: list[str], timeout: float) -> str:
        """Run a command as root on the main node; its standard output."""
        ...

    def usage_probe(self) -> UsageProbe:
        """Reads every node while the benchmark runs; raises ``UsageUnavailable`` saying why
        the stack's usage cannot be measured."""
        ...

    def activation_shape(self) -> ActivationShape | None:
        """The model's hidden-state and vocabulary sizes, when its GGUF is at hand."""
        ...

    def destroy(self) -> None: ...

    def leftovers(self) -> list[str]:
        """Everything of the stack still there after destroy, each named; [] if nothing."""
        ...

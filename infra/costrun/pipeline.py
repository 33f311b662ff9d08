"""One stack's cost run, step by step: preflight, up, wait until serving, benchmark, then destroy
and audit whatever happened (unless kept), each step an event."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra.boot import metrics_command
from infra.costrun import rpc_bytes
from infra.costrun.events import EventLog
from infra.costrun.target import Prediction, StepError, Target
from infra.observe.usage import (
    DEFAULT_INTERVAL_SECONDS,
    Recorder,
    UsageProbe,
    UsageUnavailable,
    summarize,
)

BENCH_COMMAND = tuple(metrics_command.bench_command())
# For the predicted cost of a run: the benchmark and the destroy, beyond the time to serve.
BENCH_ESTIMATE_SECONDS = 600
DESTROY_ESTIMATE_SECONDS = 300


@dataclass(frozen=True)
class RunOptions:
    bench_args: tuple[str, ...] = ()
    timeout_seconds: float = 3600  # from `up` until the main node serves
    max_usd: float | None = None
    keep: bool = False
    poll_seconds: float = 10
    bench_timeout_seconds: float = 7200
    # Every node is read at this interval while the benchmark runs (CPU, memory, KV cache).
    usage_interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    # The requests that measure the bytes between the main node and its workers per token.
    rpc_bytes_lengths: rpc_bytes.Lengths = field(default_factory=rpc_bytes.Lengths)


def predicted_usd(prediction: Prediction) -> float | None:
    """The run's predicted cost for a stack: its $/h over the time to serve, the benchmark and
    the destroy, plus one-off charges."""
    if prediction.hourly_usd is None:
        return None
    seconds = prediction.serve_seconds.get("total", 0) + BENCH_ESTIMATE_SECONDS
    seconds += DESTROY_ESTIMATE_SECONDS
    return prediction.hourly_usd * seconds / 3600 + prediction.one_off_usd


class Spend:
    """Dollars so far: $/h since `up` began, plus one-off charges."""

    def __init__(self, prediction: Prediction, clock: Callable[[], float]) -> None:
        self.hourly = prediction.hourly_usd or 0.0
        self.one_off = prediction.one_off_usd
        self.clock = clock
        self.started: float | None = None
        self.stopped: float | None = None

    def start(self) -> None:
        self.started = self.clock()

    def stop(self) -> None:
        if self.started is not None and self.stopped is None:
            self.stopped = self.clock()

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.stopped or self.clock()) - self.started

    @property
    def usd(self) -> float:
        return 0.0 if self.started is None else self.hourly * self.seconds / 3600 + self.one_off


def run_stack(
    target: Target,
    log: EventLog,
    options: RunOptions,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] | None = None,
) -> bool:
    """The whole cost run of one stack; True when it served, was measured and left nothing."""
    sleep = sleep or time.sleep
    measured = False
    clean = True
    spend: Spend | None = None
    try:
        log.emit("preflight")
        missing = target.preflight()
        if missing:
            raise StepError("preflight: " + "; ".join(missing))
        prediction = target.predict()
        spend = Spend(prediction, clock)
        log.emit("predicted", prediction=prediction.to_json(), stack=target.describe())
        log.emit("up")
        spend.start()
        outputs = target.up()
        log.emit("up_done", outputs=outputs, seconds=round(spend.seconds, 1))
        log.emit("wait")
        status = _wait_serving(target, log, options, spend=spend, sleep=sleep, clock=clock)
        log.emit("serving", status=status, seconds=round(spend.seconds, 1))
        log.emit("bench")
        output, finish_usage = _benchmark(target, log, options)
        try:
            try:
                result = json.loads(output)
            except json.JSONDecodeError:
                raise StepError(f"the benchmark printed no JSON: {output[-300:]!r}") from None
            log.emit("bench_done", result=result, seconds=round(spend.seconds, 1))
            measured = True
        finally:
            # After the result is recorded: bringing the usage back can take a while.
            finish_usage()
    except KeyboardInterrupt:
        log.emit("interrupted")
        raise
    except StepError as error:
        log.emit("error", message=str(error))
    except Exception as error:  # noqa: BLE001 (any other failure ends the run as an event; the destroy still runs)
        log.emit("error", message=f"{type(error).__name__}: {error}")
    finally:
        if spend is not None and spend.started is not None:
            clean = _destroy_and_audit(target, log, options, spend)
        log.emit(
            "finished",
            ok=measured and clean,
            spent_usd=round(spend.usd, 4) if spend else 0.0,
            seconds=round(spend.seconds, 1) if spend else 0.0,
        )
    return measured and clean


def _benchmark(
    target: Target, log: EventLog, options: RunOptions
) -> tuple[str, Callable[[], None]]:
    """The bytes per token between the main node and its workers, then the benchmark script on
    the main node, every node read at a fixed interval while it runs: the script's output, and
    what stops the readings and reports them."""
    probe = _usage_probe(target, log)
    if probe is not None:
        _measure_rpc_bytes(target, probe, log, options)
    recorder = _start_recorder(probe, log, options) if probe is not None else None

    def finish() -> None:
        if probe is not None and recorder is not None:
            _stop_recorder(probe, recorder, log)

    try:
        output = target.run_on_main(
            [*BENCH_COMMAND, *options.bench_args], options.bench_timeout_seconds
        )
    except BaseException:
        finish()
        raise
    return output, finish


def _start_recorder(probe: UsageProbe, log: EventLog, options: RunOptions) -> Recorder | None:
    try:
        return probe.recorder(options.usage_interval_seconds).start()
    except Exception as error:  # noqa: BLE001 (a figure of the report, not a step: the benchmark goes on)
        log.emit("usage_unmeasured", what="usage", reason=f"{type(error).__name__}: {error}")
        return None


def _stop_recorder(probe: UsageProbe, recorder: Recorder, log: EventLog) -> None:
    try:
        readings = recorder.stop()
    except Exception as error:  # noqa: BLE001 (a figure of the report, not a step)
        log.emit("usage_unmeasured", what="usage", reason=f"{type(error).__name__}: {error}")
        return
    log.emit(
        "usage",
        how=probe.describe(),
        **summarize(
            readings,
            probe.roles,
            interval=recorder.interval,
            failures=recorder.failures,
            last_error=recorder.last_error,
        ),
    )


def _usage_probe(target: Target, log: EventLog) -> UsageProbe | None:
    try:
        return target.usage_probe()
    except UsageUnavailable as error:
        reason = str(error)
    except Exception as error:  # noqa: BLE001 (a figure of the report, not a step: the benchmark goes on)
        reason = f"{type(error).__name__}: {error}"
    log.emit("usage_unmeasured", what="usage and bytes per token", reason=reason)
    return None


def _measure_rpc_bytes(
    target: Target, probe: UsageProbe, log: EventLog, options: RunOptions
) -> None:
    """A figure of the report, not a step: when it cannot be measured, the report says why and
    the benchmark goes on."""
    if "worker" not in probe.roles.values():
        log.emit("usage_unmeasured", what="bytes per token", reason="the stack has no workers")
        return
    try:
        measured = rpc_bytes.measure(probe, options.rpc_bytes_lengths)
        shape = target.activation_shape()
    except Exception as error:  # noqa: BLE001 (a figure of the report, not a step)
        log.emit(
            "usage_unmeasured", what="bytes per token", reason=f"{type(error).__name__}: {error}"
        )
        return
    model = rpc_bytes.compare(measured, shape) if shape else None
    log.emit("rpc_bytes", measured=measured, model=model)


def _wait_serving(
    target: Target,
    log: EventLog,
    options: RunOptions,
    *,
    spend: Spend,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> dict[str, Any]:
    deadline = clock() + options.timeout_seconds
    seen = ""
    while True:
        if options.max_usd is not None and spend.usd > options.max_usd:
            raise StepError(f"over budget: ${spend.usd:.2f} spent of --max-usd {options.max_usd}")
        try:
            status = target.node_status()
        except StepError as error:  # the channel may not answer yet (an agent still starting)
            status = {"phase": "unreachable", "last_error": str(error)}
        phase = str(status.get("phase", "starting"))
        if phase != seen:
            log.emit("phase", phase=phase, seconds=round(spend.seconds, 1))
            seen = phase
        if phase == "serving":
            return status
        if phase == "failed":
            raise StepError(f"the main node failed: {status.get('last_error')}")
        if clock() > deadline:
            raise StepError(
                f"not serving after {options.timeout_seconds:.0f} s (phase {phase}; "
                f"{status.get('last_error') or 'no error reported'}); raise --timeout"
            )
        sleep(options.poll_seconds)


def _destroy_and_audit(target: Target, log: EventLog, options: RunOptions, spend: Spend) -> bool:
    if options.keep:
        log.emit("kept", message="--keep: the stack keeps running, and costing")
        return True
    log.emit("destroy")
    try:
        target.destroy()
        spend.stop()
        log.emit("destroyed", seconds=round(spend.seconds, 1))
    except Exception as error:  # noqa: BLE001 (whatever failed, the audit still looks)
        spend.stop()
        log.emit("error", message=f"destroy failed: {error}")
    log.emit("audit")
    try:
        leftovers = target.leftovers()
    except Exception as error:  # noqa: BLE001 (the audit reports what it could not read)
        leftovers = [f"the audit could not look: {error}"]
    log.emit("audited", leftovers=leftovers)
    return not leftovers

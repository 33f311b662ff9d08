"""The cost run's report, made from the events alone: ``report.json`` (versioned), ``report.md``
and ``report.png`` (measured next to predicted, per stack)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from infra.costrun.events import last, phase_of, read_events, stack_dirs

# 2: each stack gains "usage" (per node CPU, memory, bytes; the KV cache), "rpc_bytes" (bytes
# per generated token between the main node and its workers) and "unmeasured".
# 3: "measured" gains "draft" (a draft model's drafted and accepted tokens over the requests),
# "decode_measured_by" and "decode_tps_without_draft"; "predicted" gains "draft_acceptance" and
# "draft_basis".
# 4: each stack gains "price_partial" and "unpriced": its price leaves out those parts (a
# disk, Tier_1 networking), which the catalog cannot price, and its $ figures are floors ("+").
SCHEMA_VERSION = 4


def stack_report(name: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    predicted_event = last(events, "predicted") or {}
    prediction = predicted_event.get("prediction", {})
    serving = last(events, "serving")
    bench = (last(events, "bench_done") or {}).get("result")
    finished = last(events, "finished") or {}
    audited = last(events, "audited")
    status = serving["status"] if serving else {}
    measured_serve = {
        "total": serving["seconds"] if serving else None,
        # A build the node found complete took no time.
        "build": status.get("build_seconds", 0.0 if status.get("build_skipped") else None),
        "download": status.get("download_seconds"),
        "wait": status.get("wait_seconds"),
        "load": status.get("load_seconds"),
    }
    requests = (bench or {}).get("requests") or {}
    draft = requests.get("draft")
    llama_bench = (bench or {}).get("llama_bench") or {}
    # llama-bench runs the model alone: with a draft model, what the stack serves is the
    # requests' decode, through llama-server and its draft.
    if draft or not llama_bench.get("decode_tps"):
        decode_tps, decode_by = requests.get("decode_tps"), "requests" if requests else None
    else:
        decode_tps, decode_by = llama_bench["decode_tps"], "llama-bench"
    hourly = prediction.get("hourly_usd")
    mean_tps = decode_tps["mean"] if decode_tps else None
    return {
        "stack": name,
        **predicted_event.get("stack", {}),
        "phase": phase_of(events),
        "ok": bool(finished.get("ok")),
        "errors": [e["message"] for e in events if e["event"] == "error"],
        "predicted": prediction,
        "measured": {
            "serve_seconds": measured_serve,
            "prompt_tps": llama_bench.get("prompt_tps"),
            "prompt_tokens": llama_bench.get("prompt_tokens"),
            # What a user waits for: the requests' prompt, as llama-server timed it.
            "first_token_seconds": _first_token(requests),
            "decode_tps": decode_tps,
            "decode_measured_by": decode_by,
            "decode_tps_without_draft": llama_bench.get("decode_tps") if draft else None,
            "requests": requests or None,
            "draft": draft,
        },
        "hourly_usd": hourly,
        "price_partial": bool(prediction.get("unpriced")),
        "unpriced": list(prediction.get("unpriced") or []),
        "spent_usd": finished.get("spent_usd"),
        "seconds_up": finished.get("seconds"),
        "usd_per_million_tokens": (
            round(hourly / (mean_tps * 3600) * 1e6, 3) if hourly is not None and mean_tps else None
        ),
        "leftovers": audited["leftovers"] if audited else None,
        "kept": last(events, "kept") is not None,
        "usage": _payload(last(events, "usage")),
        "rpc_bytes": _payload(last(events, "rpc_bytes")),
        "unmeasured": [
            {"what": e["what"], "reason": e["reason"]}
            for e in events
            if e["event"] == "usage_unmeasured"
        ],
    }


def _first_token(requests: dict[str, Any]) -> float | None:
    rate = requests.get("prompt_tps")
    if not requests.get("prompt_tokens") or not rate or not rate.get("mean"):
        return None
    return round(float(requests["prompt_tokens"]) / float(rate["mean"]), 3)


def _prompt_predicted(measured: dict[str, Any], predicted: dict[str, Any]) -> Any:
    """The predicted prompt rate, where it is for the prompt llama-bench measured."""
    tokens = predicted.get("prompt_tokens")
    return predicted.get("prompt_tps") if tokens and tokens == measured["prompt_tokens"] else None


def _payload(event: dict[str, Any] | None) -> dict[str, Any] | None:
    """An event's figures, without its name and time."""
    if event is None:
        return None
    return {k: v for k, v in event.items() if k not in ("at", "event")}


def build(run_dir: Path) -> dict[str, Any]:
    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    return {
        "schema_version": SCHEMA_VERSION,
        "run": run,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stacks": [
            stack_report(d.name, read_events(d / "events.jsonl")) for d in stack_dirs(run_dir)
        ],
    }


def first_token_lines(stack: dict[str, Any]) -> list[str]:
    """The time to the first token: the requests' as measured, the planner's for its prompt."""
    measured, predicted = stack["measured"], stack["predicted"]
    found = []
    if measured.get("first_token_seconds") is not None:
        tokens = measured["requests"]["prompt_tokens"]
        found.append(f"measured {measured['first_token_seconds']:.2f} s after {tokens} tokens")
    if predicted.get("first_token_seconds") is not None:
        found.append(
            f"predicted {predicted['first_token_seconds']:.2f} s after "
            f"{predicted['prompt_tokens']} tokens"
        )
    return [f"- first token: {'; '.join(found)}"] if found else []


def _figure(value: Any, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, dict):
        return f"{value['mean']:.{digits}f} ± {value['stdev']:.{digits}f}{unit}"
    return f"{value:.{digits}f}{unit}"


def markdown(report: dict[str, Any]) -> str:
    run = report["run"]
    lines = [
        f"# Cost run {run.get('id', '')}",
        "",
        f"Stacks: {', '.join(s['stack'] for s in report['stacks'])}. Generated "
        f"{report['generated_at']} (report schema {report['schema_version']}).",
        "",
        "| stack | nodes | time to serve (s): measured / predicted | prompt tok/s: measured / "
        "predicted | decode tok/s: "
        "measured / predicted | main<->workers per token | $/h | $ spent | $/Mtok | left behind "
        "| result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in report["stacks"]:
        measured, predicted = s["measured"], s["predicted"]
        left = s["leftovers"]
        behind = "nothing" if left == [] else "; ".join(left or ["not audited"])
        lines.append(
            f"| {s['stack']} | {_nodes(s)} "
            f"| {_figure(measured['serve_seconds']['total'])} / "
            f"{_figure(predicted.get('serve_seconds', {}).get('total'))} "
            f"| {_figure(measured['prompt_tps'])} / "
            f"{_figure(_prompt_predicted(measured, predicted))} "
            f"| {_figure(measured['decode_tps'])} / {_figure(predicted.get('decode_tps'))} "
            f"| {_per_token(s.get('rpc_bytes'))} "
            f"| {_usd(s, 'hourly_usd', 4)} | {_usd(s, 'spent_usd', 4)} "
            f"| {_usd(s, 'usd_per_million_tokens', 2)} "
            f"| {'kept (--keep)' if s['kept'] else behind} "
            f"| {'ok' if s['ok'] else 'FAILED'} |"
        )
    partial = [s for s in report["stacks"] if s.get("price_partial")]
    if partial:
        left_out = "; ".join(f"{s['stack']}: {', '.join(s['unpriced'])}" for s in partial)
        lines += ["", f"+: the price leaves out what the catalog cannot price ({left_out})."]
    lines.append("")
    for s in report["stacks"]:
        lines += [f"## {s['stack']}", ""]
        for key in (
            "provider",
            "region",
            "machine",
            "nodes",
            "llama_cpp_commit",
            "model",
            "draft_model",
        ):
            if key in s:
                shown = _nodes(s) if key == "nodes" else s[key]
                lines.append(f"- {key.replace('_', ' ')}: {shown}")
        serve = s["measured"]["serve_seconds"]
        lines.append(
            "- time to serve, measured: "
            + ", ".join(f"{k} {_figure(v)} s" for k, v in serve.items())
        )
        predicted = s["predicted"]
        if predicted.get("serve_seconds"):
            lines.append(
                "- time to serve, predicted: "
                + ", ".join(f"{k} {v:.0f} s" for k, v in predicted["serve_seconds"].items())
            )
        requests = s["measured"]["requests"]
        if requests:
            lines.append(
                f"- {requests['count']} seeded requests of {requests['prompt_tokens']} prompt and "
                f"{requests['predicted_tokens']} generated tokens: prompt "
                f"{_figure(requests['prompt_tps'])}, decode {_figure(requests['decode_tps'])} tok/s"
            )
        lines += first_token_lines(s)
        lines += draft_lines(s)
        if predicted.get("price_source"):
            lines.append(f"- prices: {predicted['price_source']}")
        if predicted.get("note"):
            lines.append(f"- {predicted['note']}")
        for error in s["errors"]:
            lines.append(f"- error: {error}")
        lines += ["", *usage_lines(s)]
    return "\n".join(lines)


def draft_lines(stack: dict[str, Any]) -> list[str]:
    """What the draft model did: the drafted tokens the model accepted over the seeded requests
    (llama-server's own counts), beside the share the prediction assumed."""
    measured, predicted = stack["measured"], stack["predicted"]
    draft = measured.get("draft")
    if not draft:
        if stack.get("draft_model"):
            return [f"- draft model {stack['draft_model']}: nothing drafted in the requests"]
        return []
    temperature = (measured.get("requests") or {}).get("temperature")
    sampled = f" at temperature {temperature:g}" if temperature is not None else ""
    alone = measured.get("decode_tps_without_draft")
    lines = [
        f"- draft model {stack.get('draft_model', '')}: {draft['accepted']} of "
        f"{draft['drafted']} drafted tokens accepted ({draft['ratio']:.1%}) over the "
        f"requests{sampled}; decode is the requests'"
        + (f" (llama-bench runs the model alone: {_figure(alone)} tok/s)" if alone else "")
    ]
    if predicted.get("draft_acceptance") is not None:
        lines.append(
            f"- the prediction assumed {predicted['draft_acceptance']:.1%} accepted: "
            f"{predicted.get('draft_basis', '')}"
        )
    elif predicted.get("draft_basis"):
        lines.append(f"- predicted: {predicted['draft_basis']}")
    return lines


# The order the report says how each figure was read in (the events store keys sorted).
HOW_ORDER = ["cpu", "memory", "bytes", "kv_cache"]
HOW_NAMES = {"cpu": "CPU", "kv_cache": "KV cache"}


def _size(count: float | None) -> str:
    """Bytes in the unit that reads best: 812 B, 10.6 KiB, 1.02 MiB, 1.20 GiB."""
    if count is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(count) >= scale:
            return f"{count / scale:.{1 if unit == 'KiB' else 2}f} {unit}"
    return f"{count:.0f} B"


def _per_token(rpc: dict[str, Any] | None) -> str:
    if not rpc:
        return "n/a"
    return _size(rpc["measured"]["total_bytes_per_token"]["mean"])


def usage_lines(stack: dict[str, Any]) -> list[str]:
    """The stack's usage during its benchmark: a table per node, the KV cache, and the bytes per
    generated token between the main node and its workers, set against the hidden state."""
    lines: list[str] = []
    usage, rpc = stack.get("usage"), stack.get("rpc_bytes")
    if usage:
        per_token = (rpc or {}).get("measured", {}).get("nodes", {})
        lines += [
            f"Usage during the benchmark ({usage['seconds']:.0f} s, every node read each "
            f"{usage['interval_seconds']:g} s; CPU in % of one core, peak over one interval):",
            "",
            "| node | role | CPU mean % | CPU peak % | peak memory | received | sent "
            "| bytes per generated token |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, node in usage["nodes"].items():
            if "not_measured" in node:
                lines.append(f"| {name} | {node['role']} | {node['not_measured']} {'| ' * 5}|")
                continue
            token = per_token.get(name, {}).get("bytes_per_token")
            lines.append(
                f"| {name} | {node['role']} | {node['cpu_mean_percent']:.0f} "
                f"| {node['cpu_peak_percent']:.0f} | {_size(node['memory_peak_bytes'])} "
                f"| {_size(node['received_bytes'])} | {_size(node['sent_bytes'])} "
                f"| {_size(token['mean']) if token else 'n/a'} |"
            )
        lines.append("")
        kv = usage.get("kv_cache")
        lines.append(
            f"- KV cache, peak: {100 * kv['peak_ratio']:.1f} % ({kv['peak_tokens']} of "
            f"{kv['capacity_tokens']} tokens)"
            if kv
            else "- KV cache: not read"
        )
        if usage.get("failed_readings"):
            lines.append(
                f"- {usage['failed_readings']} readings failed (last: {usage['last_error']})"
            )
        how = usage.get("how", {})
        if how:
            order = [k for k in HOW_ORDER if k in how] + [k for k in how if k not in HOW_ORDER]
            read = "; ".join(f"{HOW_NAMES.get(k, k)}, {how[k]}" for k in order)
            lines.append(f"- read from: {read}")
    if rpc:
        lines += rpc_lines(rpc)
    for item in stack.get("unmeasured", []):
        lines.append(f"- {item['what']}: {item['reason']}")
    return [*lines, ""] if lines else []


def rpc_lines(rpc: dict[str, Any]) -> list[str]:
    measured, model = rpc["measured"], rpc.get("model")
    total = measured["total_bytes_per_token"]
    workers = [
        f"{name} {_size(node['bytes_per_token']['mean'])}"
        for name, node in measured["nodes"].items()
        if node["role"] == "worker"
    ]
    lines = [
        f"- between the main node and its workers: {_size(total['mean'])} ± "
        f"{_size(total['stdev'])} per generated token ({', '.join(workers)}; "
        f"{measured['method']}, {measured['short_tokens']} and {measured['long_tokens']} "
        f"tokens after a {measured['prompt_tokens']}-token prompt, {measured['repeats']} times)"
    ]
    if model:
        lines.append(
            f"- against the model ({model['architecture']}): "
            f"{model['ratio_to_hidden_state']:.1f} x its hidden state of "
            f"{_size(model['hidden_state_bytes'])} (n_embd {model['n_embd']} x f32), "
            f"{model['ratio_per_crossing']:.1f} x per crossing (with "
            f"{measured['workers']} workers a token's hidden state crosses "
            f"{model['hidden_state_crossings']} times, and its logits, "
            f"{_size(model['logits_bytes'])} of {model['n_vocab']} x f32, once); "
            f"{model['ratio_to_expected_payload']:.3f} x the payload ggml-rpc must carry "
            f"({_size(model['expected_payload_bytes'])})"
        )
    return lines


def _usd(stack: dict[str, Any], key: str, digits: int) -> str:
    """A $ figure of the stack's, ``+`` where its price leaves a part out."""
    value = stack.get(key)
    shown = _figure(value, digits)
    return shown + ("+" if value is not None and stack.get("price_partial") else "")


def _nodes(stack: dict[str, Any]) -> str:
    nodes = stack.get("nodes")
    if not nodes:
        return "n/a"
    return f"1 x {nodes['main']} + {nodes['workers']} x {nodes.get('worker', nodes['main'])}"


def chart(report: dict[str, Any], path: Path) -> None:
    """Measured beside predicted for each stack: time to serve, decode (the measured bar with
    its spread), and the $ of the run: $/h as priced and $ per million generated tokens, ``+``
    where a price leaves a part out. A figure that is missing is drawn as no bar, marked n/a."""
    import matplotlib  # noqa: PLC0415 (only the report needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    stacks = report["stacks"]
    names = [s["stack"] for s in stacks]
    plus = ["+" if s.get("price_partial") else "" for s in stacks]
    decode = [s["measured"]["decode_tps"] or {} for s in stacks]
    panels: list[tuple[str, list[Any], list[Any], list[Any], list[str]]] = [
        ("time to serve (s)", [s["measured"]["serve_seconds"]["total"] for s in stacks],
         [s["predicted"].get("serve_seconds", {}).get("total") for s in stacks],
         [None] * len(stacks), [""] * len(stacks)),
        ("decode tokens/s", [d.get("mean") for d in decode],
         [s["predicted"].get("decode_tps") for s in stacks],
         [d.get("stdev") for d in decode], [""] * len(stacks)),
        ("$ per hour (+: a part unpriced)", [s.get("hourly_usd") for s in stacks],
         [None] * len(stacks), [None] * len(stacks), plus),
        ("$ per million tokens", [s.get("usd_per_million_tokens") for s in stacks],
         [None] * len(stacks), [None] * len(stacks), plus),
    ]  # fmt: skip
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    positions = list(range(len(names)))
    for axis, (title, measured, predicted, spread, marks) in zip(axes, panels, strict=True):
        paired = any(p is not None for p in predicted)
        width, offset = (0.4, 0.2) if paired else (0.6, 0.0)
        _bars(
            axis, [x - offset for x in positions], measured, width, "measured",
            spread=spread, marks=marks,
        )  # fmt: skip
        if paired:
            _bars(axis, [x + offset for x in positions], predicted, width, "predicted")
            axis.legend()
        axis.set_xticks(positions, names)
        axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _bars(
    axis: Any, where: list[float], values: list[Any], width: float, label: str,
    *, spread: list[Any] | None = None, marks: list[str] | None = None,
) -> None:  # fmt: skip
    """Bars where there are values; ``n/a`` at the base where there is none, never a 0 bar."""
    spread = spread or [None] * len(values)
    marks = marks or [""] * len(values)
    known = [i for i, value in enumerate(values) if value is not None]
    if known:
        errors = [spread[i] or 0 for i in known] if any(spread[i] for i in known) else None
        bars = axis.bar(
            [where[i] for i in known], [values[i] for i in known], width, label=label,
            yerr=errors, capsize=4 if errors else 0,
        )  # fmt: skip
        axis.bar_label(bars, labels=[f"{values[i]:,.2f}{marks[i]}" for i in known], fontsize=8)
    for x, value in zip(where, values, strict=True):
        if value is None:
            axis.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8)


def write(run_dir: Path) -> dict[str, Any]:
    report = build(run_dir)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (run_dir / "report.md").write_text(markdown(report))
    chart(report, run_dir / "report.png")
    return report

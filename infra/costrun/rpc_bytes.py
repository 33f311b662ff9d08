"""The bytes the main node and its workers exchange per generated token: measured, and what
ggml-rpc has to send for it.

Measured by two generation lengths: the same prompt is completed greedily with ``cache_prompt``
off and ``ignore_eos``, once for ``short`` and once for ``long`` tokens, reading every node's
counters before and after each. The prompt's evaluation, the first decode's graph build and the
HTTP exchange are the same in both, and so is the KV cache llama-server pulls back from the
workers into its prompt cache in RAM when a request arrives (the previous request's: a one-token
request, not measured, goes first each time). So (bytes of the long one - bytes of the short one)
/ (long - short) is what one more generated token costs, with nothing of the prompt phase in it.
(A reading between the prompt and the first token would race the next decode step: llama-server
offers no moment between the two that a reader outside can catch.) The pair is repeated; the
spread shows the noise.

What crosses the network for one generated token at the pinned commit, once llama.cpp reuses the
decode graph (it does until the KV cache's used cells pass a multiple of 256, when each worker
gets its whole graph again in a ``GRAPH_COMPUTE``), as read from ggml/src/ggml-rpc/ggml-rpc.cpp
and the scheduler in ggml/src/ggml-backend.cpp, and seen in the workers' messages:

- main node -> first worker: the residual stream, as two f32 tensors of ``n_embd`` (the scheduler
  runs the residual add that ends the main node's last layer with the worker's first layer, so
  ``ffn_inp`` and ``ffn_out`` both cross: ``SET_TENSOR``);
- from one worker to the next: through the main node, as RPC buffers on two servers cannot copy
  to each other (``cpy_tensor`` refuses, and the scheduler falls back to ``GET_TENSOR`` from one
  and ``SET_TENSOR`` to the other): the hidden state twice;
- the last worker holds the output head (``infra.core.placement``): the logits come back,
``n_vocab`` f32 (``GET_TENSOR``);
- each worker also gets the graph's small inputs (the token's position, and for each KV cache
  (two with sliding-window attention) the K and V cell indices and the KQ mask, f16 over ``n_kv``
  cells), a ``GRAPH_RECOMPUTE``, and every message carries 9 bytes of framing and the 296-byte
  ``rpc_tensor`` it is about, each in a TCP segment of its own with its headers.

So with k workers a token's hidden state crosses the wire 2k times (2k - 1 if a model's split
fell on a layer's end), and its logits once: with a large vocabulary the logits are most of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.models.gguf_header import header_fields
from infra.observe.metrics import increase
from infra.observe.usage import Reading, UsageProbe, spread

ACTIVATION_BYTES = 4  # f32: the activations and logits ggml-rpc moves
KV_CELL_PADDING = 256  # llama_kv_cache::get_n_kv pads the cells a graph sees to 256
# The band a measurement must fall in, from what ggml-rpc sends (see the module docstring):
# - TCP/IP on the hidden states and logits: a 66-byte header (Ethernet, IPv4, TCP with
#   timestamps) per segment of up to 1448 bytes is 4.6 %, an ACK for every two segments 2.3 %
#   more; 10 % bounds it.
TRANSPORT_OVERHEAD = 0.10
# - per worker and token, besides them: up to 12 messages (two hidden-state tensors, the
#   position, two KV caches' K and V indices and masks, the output ids, GRAPH_RECOMPUTE, a GET),
#   each with its framing, its rpc_tensor, the offset, up to three segments (command, size, body)
#   and an ACK; and two KQ masks of n_kv cells, counted at 4 bytes a cell.
CONTROL_MESSAGES = 12
MESSAGE_BYTES = 9 + 296 + 9 + 4 * 66
KV_CACHES = 2


@dataclass(frozen=True)
class ActivationShape:
    """What the model's activations weigh: read from its GGUF header."""

    architecture: str
    n_embd: int
    n_vocab: int

    @property
    def hidden_state_bytes(self) -> int:
        return self.n_embd * ACTIVATION_BYTES

    @property
    def logits_bytes(self) -> int:
        return self.n_vocab * ACTIVATION_BYTES


def activation_shape(path: Path) -> ActivationShape:
    """``n_embd`` and the vocabulary's size from a GGUF header (the first part of a split one)."""
    fields = header_fields(path)
    arch = str(fields["general.architecture"])
    n_embd = int(fields[f"{arch}.embedding_length"])
    vocab = fields.get(f"{arch}.vocab_size")
    n_vocab = int(vocab) if vocab else len(fields["tokenizer.ggml.tokens"])
    return ActivationShape(arch, n_embd, n_vocab)


def hidden_state_crossings(workers: int) -> int:
    """How many times a token's hidden state crosses the wire with ``workers`` workers."""
    return 2 * workers


def expected_payload_bytes(shape: ActivationShape, workers: int) -> int:
    """The activations ggml-rpc moves per generated token: hidden states and logits."""
    if workers == 0:
        return 0
    return hidden_state_crossings(workers) * shape.hidden_state_bytes + shape.logits_bytes


def control_bytes_per_worker(kv_cells: int = KV_CELL_PADDING) -> int:
    """An upper bound of what each worker exchanges per token besides hidden states and
    logits: messages, their headers, the graph's inputs."""
    return CONTROL_MESSAGES * MESSAGE_BYTES + KV_CACHES * kv_cells * ACTIVATION_BYTES


def plausible_band(
    shape: ActivationShape, workers: int, kv_cells: int = KV_CELL_PADDING
) -> tuple[int, int]:
    """The bytes per generated token between the main node and all its workers that a
    measurement must fall within: at least the payload (less one hidden state, for a split on a
    layer's end), at most the payload with TCP/IP's overhead and each worker's control bytes."""
    payload = expected_payload_bytes(shape, workers)
    if workers == 0:
        return 0, 0
    upper = payload * (1 + TRANSPORT_OVERHEAD) + workers * control_bytes_per_worker(kv_cells)
    return payload - shape.hidden_state_bytes, round(upper)


# The cost run's prompt: short (17 tokens for Gemma 3), so that prompt and generation stay under
# 256 KV cells and no graph is rebuilt during the measurement.
DEFAULT_PROMPT = "the river runs past a quiet town and the hills above it turn green in spring"


@dataclass(frozen=True)
class Lengths:
    """The measurement's requests: the prompt, and the two generation lengths."""

    prompt: str = DEFAULT_PROMPT
    short: int = 8
    long: int = 40
    repeats: int = 3
    timeout: float = 600

    def __post_init__(self) -> None:
        if not 0 < self.short < self.long or self.repeats < 1:
            raise ValueError(
                f"give 0 < short < long and at least one repeat (short {self.short}, long "
                f"{self.long}, repeats {self.repeats})"
            )


def _generate(
    probe: UsageProbe, lengths: Lengths, tokens: int
) -> tuple[Reading, Reading, int, int]:
    before = probe.read()
    reply = probe.complete(
        {
            "prompt": lengths.prompt,
            "n_predict": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
        },
        timeout=lengths.timeout,
    )
    after = probe.read()
    timings = reply.get("timings", {})
    return before, after, int(timings.get("predicted_n", 0)), int(timings.get("prompt_n", 0))


def _after_reset(
    probe: UsageProbe, lengths: Lengths, tokens: int
) -> tuple[Reading, Reading, int, int]:
    """A measured request, after a one-token request that is not measured. llama-server saves
    the previous request's KV cache into its prompt cache in RAM (``--cache-ram``) when the next
    request arrives, which pulls it back from the workers: after the reset, what each measured
    request pulls is the same one-token request's state, whatever was asked before."""
    _generate(probe, lengths, 1)
    return _generate(probe, lengths, tokens)


def _bytes(before: Reading, after: Reading, node: str) -> tuple[int, int]:
    """Bytes the node received and sent between two readings."""
    a, b = before.nodes[node], after.nodes[node]
    received = increase(a.received_bytes, b.received_bytes)
    sent = increase(a.sent_bytes, b.sent_bytes)
    return int(received), int(sent)


def measure(probe: UsageProbe, lengths: Lengths) -> dict[str, Any]:
    """Bytes per generated token on each node's cluster interface, and between the main node
    and its workers in all (what the workers received and sent)."""
    roles = probe.roles
    workers = [name for name, role in roles.items() if role == "worker"]
    if not workers:
        raise ValueError("bytes between the main node and its workers need at least one worker")
    per_node: dict[str, list[float]] = {name: [] for name in roles}
    received: dict[str, list[float]] = {name: [] for name in roles}
    prompt_tokens = 0
    for _ in range(lengths.repeats):
        short = _after_reset(probe, lengths, lengths.short)
        long = _after_reset(probe, lengths, lengths.long)
        extra = long[2] - short[2]
        if extra <= 0:
            raise ValueError(
                f"the long request generated {long[2]} tokens and the short one {short[2]}: "
                "the server stopped early (does it honour ignore_eos and n_predict?)"
            )
        prompt_tokens = long[3]
        for name in roles:
            short_in, short_out = _bytes(short[0], short[1], name)
            long_in, long_out = _bytes(long[0], long[1], name)
            per_node[name].append((long_in + long_out - short_in - short_out) / extra)
            received[name].append((long_in - short_in) / extra)
    totals = [sum(per_node[w][i] for w in workers) for i in range(lengths.repeats)]
    return {
        "method": "two generation lengths (the difference per extra token)",
        "prompt_tokens": prompt_tokens,
        "short_tokens": lengths.short,
        "long_tokens": lengths.long,
        "repeats": lengths.repeats,
        "workers": len(workers),
        "total_bytes_per_token": spread(totals),
        "nodes": {
            name: {
                "role": roles[name],
                "bytes_per_token": spread(per_node[name]),
                "received_per_token": spread(received[name]),
            }
            for name in roles
        },
    }


def compare(measured: Mapping[str, Any], shape: ActivationShape) -> dict[str, Any]:
    """The measurement set against the model's hidden state and against ggml-rpc's payload."""
    workers = int(measured["workers"])
    total = float(measured["total_bytes_per_token"]["mean"])
    crossings = hidden_state_crossings(workers)
    payload = expected_payload_bytes(shape, workers)
    low, high = plausible_band(shape, workers)
    return {
        "architecture": shape.architecture,
        "n_embd": shape.n_embd,
        "n_vocab": shape.n_vocab,
        "hidden_state_bytes": shape.hidden_state_bytes,
        "logits_bytes": shape.logits_bytes,
        "hidden_state_crossings": crossings,
        "expected_payload_bytes": payload,
        "plausible_band_bytes": [low, high],
        "ratio_to_hidden_state": round(total / shape.hidden_state_bytes, 2),
        "ratio_per_crossing": round(total / (crossings * shape.hidden_state_bytes), 2),
        "ratio_to_expected_payload": round(total / payload, 4),
        "in_band": low <= total <= high,
    }

"""The llama-server flags a stack may add (``serverArgs``): an allow-list, each flag with the
values it takes, and the flags the product sets itself, each refused with the reason.

The product plans the placement, the context and the memory of every node, binds the server to
the node's private address, serves metrics and holds the API key: a flag that would change any
of those is refused, not passed. Flags are those of the pinned llama.cpp (``common/arg.cpp``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# An API key as a stack may give it (apiKey), or `none`: one word a header and a file carry.
API_KEY = re.compile(r"none|[A-Za-z0-9._~+/=-]{16,256}")
# A model's id as clients send it: what llama-server's --alias takes (modelAlias), one word.
MODEL_ALIAS = re.compile(r"[A-Za-z0-9._:/+-]{1,128}")


def _number(low: float, high: float) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        try:
            return low <= float(value) <= high
        except ValueError:
            return False

    return check


def _whole(low: int, high: int) -> Callable[[str], bool]:
    return lambda value: value.lstrip("-").isdigit() and low <= int(value) <= high


def _one_of(*choices: str) -> Callable[[str], bool]:
    return lambda value: value in choices


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    takes: str  # what its value is, for the error; "" for a switch
    valid: Callable[[str], bool] | None = None


# KV cache types no larger than the planned f16 (the placement counts 2 bytes per element).
_KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_TEMPLATE = re.compile(r"[A-Za-z0-9._-]{1,64}")

ALLOWED = (
    Flag(("--temp",), "a temperature from 0 to 5", _number(0, 5)),
    Flag(("--top-k",), "a whole number from 0 to 1000", _whole(0, 1000)),
    Flag(("--top-p",), "a number from 0 to 1", _number(0, 1)),
    Flag(("--min-p",), "a number from 0 to 1", _number(0, 1)),
    Flag(("--typical", "--typical-p"), "a number from 0 to 1", _number(0, 1)),
    Flag(("--repeat-penalty",), "a number from 0 to 5", _number(0, 5)),
    Flag(("--repeat-last-n",), "a whole number from -1 to 65536", _whole(-1, 65536)),
    Flag(("--presence-penalty",), "a number from -2 to 2", _number(-2, 2)),
    Flag(("--frequency-penalty",), "a number from -2 to 2", _number(-2, 2)),
    Flag(("--seed", "-s"), "a whole number", _whole(-1, 2**32 - 1)),
    Flag(("--n-predict", "-n"), "a whole number of tokens, -1 for no limit", _whole(-1, 1 << 24)),
    Flag(("--cache-type-k", "-ctk"), f"one of {', '.join(_KV_TYPES)}", _one_of(*_KV_TYPES)),
    Flag(("--cache-type-v", "-ctv"), f"one of {', '.join(_KV_TYPES)}", _one_of(*_KV_TYPES)),
    # Larger batches than the defaults would outgrow the planned compute buffers.
    Flag(("--batch-size", "-b"), "a whole number from 32 to 2048", _whole(32, 2048)),
    Flag(("--ubatch-size", "-ub"), "a whole number from 32 to 512", _whole(32, 512)),
    Flag(("--threads-batch", "-tb"), "a whole number of threads", _whole(1, 1024)),
    Flag(("--chat-template",), "a built-in template's name", _TEMPLATE.fullmatch),  # type: ignore[arg-type]
    Flag(("--jinja",), ""),
    Flag(("--no-jinja",), ""),
    Flag(
        ("--reasoning-format",),
        "none, deepseek, deepseek-legacy or auto",
        _one_of("none", "deepseek", "deepseek-legacy", "auto"),
    ),
    Flag(("--reasoning-budget",), "-1 or 0", _one_of("-1", "0")),
    Flag(("--cache-reuse",), "a whole number of tokens", _whole(0, 1 << 24)),
    Flag(("--timeout", "-to"), "seconds from 1 to 86400", _whole(1, 86400)),
    Flag(("--slot-prompt-similarity", "-sps"), "a number from 0 to 1", _number(0, 1)),
    Flag(("--keep",), "a whole number of tokens, -1 for all", _whole(-1, 1 << 24)),
    Flag(("--cont-batching", "-cb"), ""),
    Flag(("--no-cont-batching", "-nocb"), ""),
    Flag(("--no-webui",), ""),
    # Weights used as mapped, not repacked into the CPU's layout: less memory, slower kernels.
    Flag(("--no-repack", "-nr"), ""),
)

# The product's own flags, and those that would undo its plan, with why.
REFUSED = {
    ("--host", "--port", "--path", "--api-prefix"): "the product binds the server and its balancer",
    ("--rpc", "--n-gpu-layers", "-ngl", "--gpu-layers", "--tensor-split", "-ts", "--split-mode",
     "-sm", "--main-gpu", "-mg", "--device", "-dev", "--override-tensor", "-ot", "--cpu-moe",
     "--n-cpu-moe", "--fit"): "the placement is planned (infra/core/placement.py)",
    ("--ctx-size", "-c", "--parallel", "-np", "--kv-unified"): "set contextSize and slots instead",
    ("--model", "-m", "--model-url", "-mu", "--hf-repo", "-hf", "--hf-file", "-hff"):
        "the model is the stack's model setting",
    ("--alias", "-a"): "set modelAlias instead",
    ("--api-key", "--api-key-file"): "the key is the stack's apiKey setting",
    ("--metrics", "--slots", "--no-slots"): "metrics and slots serve top and the cost run",
    ("--threads", "-t"): "the node's threads follow its cores (the threads setting)",
    ("--mlock", "--no-mmap", "--mmap", "--numa"): "the memory plan assumes the mapped model",
    ("--log-file", "--log-disable", "--log-verbosity", "-lv", "--verbosity", "--log-prefix"):
        "the node's log reads the placement from llama-server's own lines",
    ("--ssl-key-file", "--ssl-cert-file"): "the API is private; the tunnel carries it",
}  # fmt: skip

_BY_NAME = {name: flag for flag in ALLOWED for name in flag.names}
_REFUSED_BY_NAME = {name: why for names, why in REFUSED.items() for name in names}


def check(args: Sequence[str]) -> str | None:
    """Why these llama-server arguments cannot be added, or None when every one may."""
    words = list(args)
    index = 0
    while index < len(words):
        word = words[index]
        name, equals, inline = word.partition("=")
        if name in _REFUSED_BY_NAME:
            return f"{name}: {_REFUSED_BY_NAME[name]}"
        flag = _BY_NAME.get(name)
        if flag is None:
            allowed = ", ".join(f.names[0] for f in ALLOWED)
            return f"{word!r} is not a flag a stack may add; the allowed: {allowed}"
        if not flag.takes:
            if equals:
                return f"{name} takes no value"
            index += 1
            continue
        if equals:
            value = inline
            index += 1
        elif index + 1 < len(words):
            value = words[index + 1]
            index += 2
        else:
            return f"{name} needs a value: {flag.takes}"
        if flag.valid is not None and not flag.valid(value):
            return f"{name} {value!r}: give {flag.takes}"
    return None

"""The llama-server flags a stack may add (``serverArgs``): an allow-list, each flag with the
values it takes, and the flags the product sets itself, each refused with the reason.

The product plans the placement, the context and the memory of every node, binds the server to
the node's private address, serves metrics and holds the API key: a flag that would change any
of those is refused, not passed. Flags are those of the pinned llama.cpp (``common/arg.cpp``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# An API key as a stack may give it (apiKey), or `none`: one word a header and a file carry.
API_KEY = re.compile(r"none|[A-Za-z0-9._~+/=-]{16,256}")
# A model's id as clients send it: what llama-server's --alias takes (modelAlias), one word.
MODEL_ALIAS = re.compile(r"[A-Za-z0-9._:/+-]{1,128}")


# The pinned parser (common/arg.cpp) reads whole numbers with std::stoi/std::stoul and decimals
# with std::stof: each takes a leading "+", spaces, hexadecimal floats, "inf" and trailing text,
# refuses what Python's int() and float() read beyond ASCII (Arabic-Indic or full-width digits,
# "1_0"), and std::stof throws on a value that underflows ("1e-50"). The grammars below are the
# plain forms both read alike: ASCII digits, an optional "-", a decimal point, no exponent; six
# decimals at most keep every value a normal float.
_WHOLE = re.compile(r"-?[0-9]{1,10}")
_DECIMAL = re.compile(r"-?[0-9]{1,6}(?:\.[0-9]{1,6})?")


@dataclass(frozen=True)
class Whole:
    """A whole number from low to high, as std::stoi and std::stoul read it."""

    low: int
    high: int

    def accepts(self, value: str) -> bool:
        return _WHOLE.fullmatch(value) is not None and self.low <= int(value) <= self.high

    def edges(self) -> tuple[str, ...]:
        return (str(self.low), str(self.high))


@dataclass(frozen=True)
class Decimal:
    """A number from low (or above it) to high, in the plain form std::stof and float() share."""

    low: float
    high: float
    above_low: bool = False

    def accepts(self, value: str) -> bool:
        if _DECIMAL.fullmatch(value) is None:
            return False
        number = float(value)
        above = self.low < number if self.above_low else self.low <= number
        return above and number <= self.high

    def edges(self) -> tuple[str, ...]:
        lowest = f"{self.low + 0.000001:.6f}" if self.above_low else f"{self.low:g}"
        return (lowest, f"{self.high:g}", "0.000001")


@dataclass(frozen=True)
class OneOf:
    choices: tuple[str, ...]

    def accepts(self, value: str) -> bool:
        return value in self.choices

    def edges(self) -> tuple[str, ...]:
        return self.choices


@dataclass(frozen=True)
class Origin:
    """One browser origin (``origin_problem``)."""

    def accepts(self, value: str) -> bool:
        return origin_problem(value) is None

    def edges(self) -> tuple[str, ...]:
        return ("https://chat.example.com", "http://127.0.0.1:65535")


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    takes: str  # what its value is, for the error; "" for a switch
    value: Whole | Decimal | OneOf | Origin | None = None


# KV cache types no larger than the planned f16 (the placement counts 2 bytes per element).
_KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

# The chat templates built into the pinned llama.cpp (src/llama-chat.cpp, LLM_CHAT_TEMPLATES).
# With Jinja on (the server's default), --chat-template's value is Jinja source, and only
# "chatml" is read as a name (common/chat.cpp, common_chat_templates_init): any other name
# needs --no-jinja, or the model is prompted with the name's letters.
BUILTIN_TEMPLATES = (
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1",
    "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4",
    "falcon3", "zephyr", "monarch", "gemma", "orion", "openchat", "vicuna", "vicuna-orca",
    "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r", "llama3", "chatglm3",
    "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world", "granite",
    "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing", "bailing-think",
    "bailing2", "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl",
    "kimi-k2", "seed_oss", "grok-2", "pangu-embedded", "solar-open",
)  # fmt: skip

# One browser origin as browsers send it: llama-server puts the value in
# Access-Control-Allow-Origin as given (tools/server/server-http.cpp, pre-routing handler), so
# only an exact origin ever matches; "*" and "localhost" make it echo the caller's origin.
_ORIGIN = re.compile(r"(https?)://([a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?)(?::([0-9]{1,5}))?")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_problem(value: str) -> str | None:
    """Why ``value`` cannot be --cors-origins, or None: one exact origin."""
    if value in ("*", "localhost", "null"):
        return (
            f"{value!r} lets other web pages use the API; give the one origin allowed, "
            "e.g. https://chat.example.com"
        )
    match = _ORIGIN.fullmatch(value)
    if match is None:
        return (
            "give one origin: http(s)://host[:port], lower case, no path (no list: "
            "llama-server sends the value as given, and a list matches no origin)"
        )
    if match[3] is not None and not 0 < int(match[3]) <= 65535:
        return f"port {match[3]} is not a TCP port"
    if match[3] is not None and int(match[3]) == _DEFAULT_PORTS[match[1]]:
        return f"browsers send {match[1]}://{match[2]} without :{match[3]}; leave the port out"
    return None


ALLOWED = (
    Flag(("--temp",), "a temperature from 0 to 5", Decimal(0, 5)),
    Flag(("--top-k",), "a whole number from 0 to 1000", Whole(0, 1000)),
    Flag(("--top-p",), "a number from 0 to 1", Decimal(0, 1)),
    Flag(("--min-p",), "a number from 0 to 1", Decimal(0, 1)),
    Flag(("--typical", "--typical-p"), "a number from 0 to 1", Decimal(0, 1)),
    # The parser refuses 0 and below (a penalty divides by it).
    Flag(("--repeat-penalty",), "a number above 0, at most 5", Decimal(0, 5, above_low=True)),
    # The parser refuses negatives: -1 is no "whole context" here.
    Flag(("--repeat-last-n",), "a whole number from 0 to 65536", Whole(0, 65536)),
    Flag(("--presence-penalty",), "a number from -2 to 2", Decimal(-2, 2)),
    Flag(("--frequency-penalty",), "a number from -2 to 2", Decimal(-2, 2)),
    Flag(("--seed", "-s"), "a whole number from -1 to 4294967295", Whole(-1, 2**32 - 1)),
    Flag(("--n-predict", "-n"), "a whole number of tokens, -1 for no limit", Whole(-1, 1 << 24)),
    Flag(("--cache-type-k", "-ctk"), f"one of {', '.join(_KV_TYPES)}", OneOf(_KV_TYPES)),
    Flag(("--cache-type-v", "-ctv"), f"one of {', '.join(_KV_TYPES)}", OneOf(_KV_TYPES)),
    # Larger batches than the defaults would outgrow the planned compute buffers.
    Flag(("--batch-size", "-b"), "a whole number from 32 to 2048", Whole(32, 2048)),
    Flag(("--ubatch-size", "-ub"), "a whole number from 32 to 512", Whole(32, 512)),
    Flag(("--threads-batch", "-tb"), "a whole number of threads from 1 to 1024", Whole(1, 1024)),
    Flag(
        ("--chat-template",),
        "a built-in template's name (llama-server --help lists them)",
        OneOf(BUILTIN_TEMPLATES),
    ),
    Flag(("--jinja",), ""),
    Flag(("--no-jinja",), ""),
    Flag(
        ("--reasoning-format",),
        "none, deepseek, deepseek-legacy or auto",
        OneOf(("none", "deepseek", "deepseek-legacy", "auto")),
    ),
    Flag(("--reasoning-budget",), "-1 or 0", OneOf(("-1", "0"))),
    Flag(("--cache-reuse",), "a whole number of tokens", Whole(0, 1 << 24)),
    Flag(("--timeout", "-to"), "seconds from 1 to 86400", Whole(1, 86400)),
    Flag(("--slot-prompt-similarity", "-sps"), "a number from 0 to 1", Decimal(0, 1)),
    Flag(("--keep",), "a whole number of tokens, -1 for all", Whole(-1, 1 << 24)),
    Flag(("--cont-batching", "-cb"), ""),
    Flag(("--no-cont-batching", "-nocb"), ""),
    Flag(("--no-webui",), ""),
    # Weights used as mapped, not repacked into the CPU's layout: less memory, slower kernels.
    Flag(("--no-repack", "-nr"), ""),
    # Which web page may call the API from a browser (default: every one).
    Flag(
        ("--cors-origins",),
        "one origin, http(s)://host[:port]",
        Origin(),
    ),
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

# Words serverArgs may hold: each allowed flag once, with its value, is fewer; more only fills
# the main node's user data.
MAX_WORDS = 64

_BY_NAME = {name: flag for flag in ALLOWED for name in flag.names}
_REFUSED_BY_NAME = {name: why for names, why in REFUSED.items() for name in names}


def _flag_problem(word: str) -> str | None:
    """Why ``word`` is not a flag a stack may add, or None."""
    name, equals, inline = word.partition("=")
    if name.startswith("--") and "_" in name:
        # The parser reads "_" in a long flag as "-": one spelling, as llama-server documents.
        return f"{word!r}: write {name.replace('_', '-')!r}"
    if name in _REFUSED_BY_NAME:
        return f"{name}: {_REFUSED_BY_NAME[name]}"
    flag = _BY_NAME.get(name)
    if flag is None:
        allowed = ", ".join(f.names[0] for f in ALLOWED)
        return f"{word!r} is not a flag a stack may add; the allowed: {allowed}"
    if equals:
        # The parser looks the whole word up as a flag's name and stops at the first "=".
        shown = f'"{name}", "{inline}"' if flag.takes else f'"{name}"'
        return f"{word!r}: llama-server takes no name=value; give [{shown}]"
    return None


def _value_problem(name: str, flag: Flag, value: str | None) -> str | None:
    if value is None:
        return f"{name} needs a value: {flag.takes}"
    if name == "--cors-origins" and (problem := origin_problem(value)):
        return f"--cors-origins {value!r}: {problem}"
    if flag.value is not None and not flag.value.accepts(value):
        return f"{name} {value!r}: give {flag.takes}"
    return None


def _template_problem(template: str | None, jinja: bool) -> str | None:
    if template in (None, "chatml") or not jinja:
        return None
    return (
        f"--chat-template {template!r}: with Jinja on (the default) llama-server reads only "
        '"chatml" as a name; add "--no-jinja" to use the built-in template'
    )


def check(args: Sequence[str]) -> str | None:
    """Why these llama-server arguments cannot be added, or None when every one may: each the
    pinned parser accepts, with the meaning the product allows."""
    words = list(args)
    if len(words) > MAX_WORDS:
        return f"{len(words)} words; at most {MAX_WORDS} (every allowed flag once is fewer)"
    template = None
    jinja = True  # the server's default (common/common.h, use_jinja); the last switch wins
    index = 0
    while index < len(words):
        if problem := _flag_problem(words[index]):
            return problem
        name = words[index]
        flag = _BY_NAME[name]
        if not flag.takes:
            jinja = {"--jinja": True, "--no-jinja": False}.get(name, jinja)
            index += 1
            continue
        value = words[index + 1] if index + 1 < len(words) else None
        if problem := _value_problem(name, flag, value):
            return problem
        template = value if name == "--chat-template" else template
        index += 2
    return _template_problem(template, jinja)


def cors_closed(args: Sequence[str]) -> bool:
    """Whether these (checked) arguments limit browsers to one origin (--cors-origins)."""
    return "--cors-origins" in args

"""The llama-server flags a stack may add: the allow-list, and the product's own flags refused
with the reason; what the allow-list accepts, the pinned llama-server's parser accepts too."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from infra.core import server_args
from tests.conftest import pinned_llama_binary


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--temp", "0.7", "--top-p", "0.9", "--seed", "42"],
        ["--temp", "0", "-ctk", "q8_0", "-ctv", "q8_0", "-ub", "256", "-b", "1024"],
        ["--jinja", "--chat-template", "chatml", "--reasoning-format", "deepseek"],
        ["--no-jinja", "--chat-template", "llama3", "--repeat-penalty", "0.000001"],
        ["--presence-penalty", "-2", "--seed", "-1", "--cors-origins", "https://chat.example.com"],
        ["--no-webui", "--cache-reuse", "256", "--timeout", "3600", "-n", "-1"],
    ],
)
def test_allowed_flags_pass(args: list[str]) -> None:
    assert server_args.check(args) is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--host", "0.0.0.0"], "--host: the product binds the server"),
        (["-ngl", "99"], "-ngl: the placement is planned"),
        (["--ctx-size=8192"], "--ctx-size: set contextSize and slots instead"),
        (["--ctx_size", "8192"], "'--ctx_size': write '--ctx-size'"),
        (["-a", "x"], "-a: set modelAlias instead"),
        (["--api-key-file", "/tmp/k"], "the key is the stack's apiKey setting"),
        (["--no-slots"], "metrics and slots serve top"),
        (["--no-mmap"], "the memory plan assumes the mapped model"),
        (["--log-disable"], "the node's log reads the placement"),
        (["--temp"], "--temp needs a value: a temperature from 0 to 5"),
        (["--temp", "hot"], "--temp 'hot': give a temperature from 0 to 5"),
        (["-ctk", "f32"], "-ctk 'f32': give one of f16"),  # twice the planned KV cache
        (["-ub", "2048"], "-ub '2048': give a whole number from 32 to 512"),
        (["--jinja=1"], """'--jinja=1': llama-server takes no name=value; give ["--jinja"]"""),
        (["--chat-template", "{{ bad }}"], "give a built-in template's name"),
        (["--chat-template", "nosuch", "--no-jinja"], "give a built-in template's name"),
        (["--no-jinja", "--chat-template", "llama3", "--jinja"], 'add "--no-jinja"'),
        (["0.7"], "'0.7' is not a flag a stack may add; the allowed: --temp, --top-k"),
    ],
)
def test_the_products_flags_and_bad_values_are_refused(args: list[str], says: str) -> None:
    problem = server_args.check(args)
    assert problem is not None and says in problem, problem


def test_every_flag_is_either_allowed_or_refused_never_both() -> None:
    allowed = {name for flag in server_args.ALLOWED for name in flag.names}
    refused = {name for names in server_args.REFUSED for name in names}
    assert not allowed & refused


# What the pinned parser refuses, or reads otherwise than Python does: each must be refused here.
# --flag=value (an unknown flag to the parser), a negative count the handler throws on, digits
# Python reads and C++ does not, a value std::stof underflows on, C's own forms (a sign, spaces,
# hexadecimal, infinity, trailing text: std::sto* read a prefix).
HOSTILE = [
    ["--temp=0.5"], ["--top-k=40"], ["--no-webui=1"], ["--cors-origins=https://a.example"],
    ["--repeat-last-n", "-1"], ["--repeat-penalty", "0"], ["--repeat-penalty", "-1"],
    ["--top-k", "\u0661\u0660"], ["--top-p", "\uff10.\uff15"], ["--top-k", "\u00b2"],
    ["--temp", "1_0"], ["--temp", "1e-50"], ["--temp", "1e-3"], ["--temp", ".5"],
    ["--temp", "+1"], ["--temp", " 1"], ["--temp", "0x1p-2"], ["--temp", "inf"],
    ["--temp", "nan"], ["--top-k", "40abc"], ["--top-k", "0x10"], ["--seed", "4294967296"],
    ["--top-k", "99999999999"], ["--chat-template", "llama3"], ["--chat-template", "nosuch"],
    ["--cors-origins", "*"], ["--cors-origins", "localhost"], ["--cors-origins", "null"],
    ["--cors-origins", "https://a.example,https://b.example"], ["--cors-origins", "https://a.example/"],
]  # fmt: skip


@pytest.mark.parametrize("args", HOSTILE, ids=repr)
def test_a_value_the_parser_refuses_or_reads_otherwise_is_refused(args: list[str]) -> None:
    problem = server_args.check(args)
    assert problem is not None and args[0].partition("=")[0] in problem, problem


@pytest.mark.parametrize(
    ("origin", "says"),
    [
        ("*", "lets other web pages use the API"),
        ("https://chat.example.com:443", "leave the port out"),
        ("https://chat.example.com:70000", "not a TCP port"),
        ("HTTPS://Chat.example.com", "give one origin"),
    ],
)
def test_cors_origins_takes_one_exact_origin(origin: str, says: str) -> None:
    problem = server_args.check(["--cors-origins", origin])
    assert problem is not None and says in problem, problem


# The product's own arguments (cloud-init/scripts/llama-server.sh), which every serverArgs
# follows; the model path is read only after the arguments are parsed.
PRODUCT_ARGS = [
    "--model", "/nonexistent/model.gguf", "--fit", "off", "--host", "127.0.0.1",
    "--port", "8080", "--ctx-size", "4096", "--parallel", "1", "--threads", "2", "--metrics",
    "--log-verbosity", "5", "--log-prefix", "--alias", "model",
]  # fmt: skip


def _parser_accepts(binary: Path, args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """Run the real parser alone: with --help, llama-server parses every argument (and checks
    the chat template), prints its usage and exits 0, or exits non-zero on the first it refuses
    (common/arg.cpp, common_params_parse). No config file or LLAMA_ARG_* variable reaches it."""
    return subprocess.run(
        [str(binary), *PRODUCT_ARGS, *args, "--help"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_CONFIG_HOME": str(home)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def _edge_cases() -> list[list[str]]:
    cases = []
    for flag in server_args.ALLOWED:
        for name in flag.names:
            if flag.value is None:
                cases.append([name])
                continue
            for value in flag.value.edges():
                jinja = ["--no-jinja"] if name == "--chat-template" and value != "chatml" else []
                cases.append([*jinja, name, value])
    return cases


def test_every_allowed_flags_edge_values_pass_the_pinned_parser(tmp_path: Path) -> None:
    binary = pinned_llama_binary("llama-server")
    refused = []
    for args in _edge_cases():
        assert server_args.check(args) is None, args
        result = _parser_accepts(binary, args, tmp_path)
        if result.returncode != 0:
            refused.append((args, result.stderr[-300:]))
    assert not refused, refused


def test_the_pinned_parser_refuses_the_reviews_cases(tmp_path: Path) -> None:
    """The cases that kept a main node from serving are refused by the binary itself: the
    check above is about llama-server, not about a guess of it."""
    binary = pinned_llama_binary("llama-server")
    cases = [
        ["--temp=0.5"], ["--repeat-last-n", "-1"], ["--top-k", "\u0661\u0660"],
        ["--top-p", "\uff10.\uff15"], ["--temp", "1e-50"], ["--repeat-penalty", "0"],
        ["--no-jinja", "--chat-template", "nosuch"],
    ]  # fmt: skip
    for args in cases:
        assert _parser_accepts(binary, args, tmp_path).returncode != 0, args
        assert server_args.check(args) is not None, args


def test_cors_origins_keeps_other_web_pages_from_reading_a_keyless_api(
    tmp_path: Path, llama_source: Path
) -> None:
    """The attack behind apiKey none's refusal, on the pinned llama-server (a generated model, on
    loopback): by default it allows any page's Origin, so a page the operator opens could read
    the tunnel's answers; with the --cors-origins serverArgs allows, only that origin is."""
    from infra.local.model import cached_model
    from infra.local.source import cache_dir
    from tests.conftest import free_port

    binary = pinned_llama_binary("llama-server")
    model = cached_model(llama_source, cache_dir())
    evil = "https://evil.example"

    def allowed_origin(extra: list[str]) -> str | None:
        assert server_args.check(extra) is None
        port = free_port()
        server = subprocess.Popen(
            [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
             "--threads", "1", "--ctx-size", "256", "--no-webui", *extra],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/models", headers={"Origin": evil}
                )
                try:
                    with urllib.request.urlopen(request, timeout=5) as answer:
                        return answer.headers.get("Access-Control-Allow-Origin")
                except OSError:
                    assert server.poll() is None and time.monotonic() < deadline
                    time.sleep(0.2)
        finally:
            server.kill()
            server.wait(timeout=30)

    assert allowed_origin([]) == evil  # any page may read the answers
    assert allowed_origin(["--cors-origins", "https://chat.example.com"]) == (
        "https://chat.example.com"
    )

"""The llama-server flags a stack may add: the allow-list, and the product's own flags refused
with the reason."""

from __future__ import annotations

import pytest

from infra.core import server_args


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--temp", "0.7", "--top-p", "0.9", "--seed", "42"],
        ["--temp=0", "-ctk", "q8_0", "-ctv", "q8_0", "-ub", "256", "-b", "1024"],
        ["--jinja", "--chat-template", "chatml", "--reasoning-format", "deepseek"],
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
        (["-a", "x"], "-a: set modelAlias instead"),
        (["--api-key-file", "/tmp/k"], "the key is the stack's apiKey setting"),
        (["--no-slots"], "metrics and slots serve top"),
        (["--no-mmap"], "the memory plan assumes the mapped model"),
        (["--log-disable"], "the node's log reads the placement"),
        (["--temp"], "--temp needs a value: a temperature from 0 to 5"),
        (["--temp", "hot"], "--temp 'hot': give a temperature from 0 to 5"),
        (["-ctk", "f32"], "-ctk 'f32': give one of f16"),  # twice the planned KV cache
        (["-ub", "2048"], "-ub '2048': give a whole number from 32 to 512"),
        (["--jinja=1"], "--jinja takes no value"),
        (["--chat-template", "{{ bad }}"], "give a built-in template's name"),
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

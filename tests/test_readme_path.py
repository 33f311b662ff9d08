"""The README's way from nothing to an answer: its deploy and connect blocks, run line by line as
written, then its destroy, against stand-ins for the tools they call (``uv``, ``pulumi``, ``aws``
with its Session Manager port forward) on PATH. The stand-in tunnel serves what llama-server
does on the forwarded port: ``/health`` to anyone, the API only with the stack's key. The path
reaches the API with the key, and every line runs: none waits in the foreground."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO

KEY = "k3y-0f-the-stack-aws-small-0123456789"
PORT = 8080  # the README's

# What the stand-in `aws ssm start-session` serves on localhost:8080, as llama-server does.
SERVER = f"""
import http.server, json, os, sys
open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))
class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            return self._answer(200, {{"status": "ok"}})
        self._answer(401, {{"error": "Invalid API Key"}})
    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        if self.headers.get("Authorization") != "Bearer {KEY}":
            return self._answer(401, {{"error": "Invalid API Key"}})
        with open(sys.argv[1], "a") as log:
            log.write(self.path + " " + body.decode() + "\\n")
        self._answer(200, {{"choices": [{{"message": {{"content": "Hello!"}}}}]}})
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", {PORT}), Handler).serve_forever()
"""


def readme_blocks() -> tuple[list[str], str]:
    """The section's bash blocks, in order, and its destroy command."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Deploy, connect, destroy", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    (destroy,) = set(re.findall(r"`(pulumi destroy --stack [\w-]+)`", section))
    return blocks, destroy


def port_free() -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", PORT)) != 0


@pytest.mark.skipif(not shutil.which("curl"), reason="the README's lines call curl")
def test_the_readmes_deploy_connect_destroy_reaches_the_api_with_the_key(
    fake_bin: tuple[Path, Callable[[str, str], Path]], tmp_path: Path
) -> None:
    if not port_free():
        pytest.skip(f"port {PORT}, the README's, is in use here")
    directory, write = fake_bin
    log, served = tmp_path / "calls.log", tmp_path / "served.log"
    (tmp_path / "server.py").write_text(SERVER)
    write("uv", f'echo "uv $*" >> {log}\n')
    write(
        "pulumi",
        f"""echo "pulumi $*" >> {log}
case "$*" in
  "stack output connectCommand --stack aws-small")
    echo "aws ssm start-session --target i-0abc --region us-east-1 --document-name \\
AWS-StartPortForwardingSessionToRemoteHost --parameters \\
host=10.0.1.10,portNumber=8080,localPortNumber=8080" ;;
  "stack output apiKey --show-secrets --stack aws-small") echo "{KEY}" ;;
  "stack output "*) echo "error: a secret output needs --show-secrets" >&2; exit 1 ;;
esac
""",
    )
    write(
        "aws",
        f"""echo "aws $*" >> {log}
case "$1 $2" in
  "ssm start-session") exec "{sys.executable}" "{tmp_path / "server.py"}" "{served}" ;;
  "service-quotas request-service-quota-increase") echo '{{"RequestedQuota": {{}}}}' ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
""",
    )
    blocks, destroy = readme_blocks()
    assert len(blocks) >= 2, "the section's deploy block and connect block, then the others"
    # As an interactive shell runs them: each background job its own process group (set -m),
    # which `kill %1` ends whole.
    script = "\n".join(["set -euo pipefail -m", *blocks, "kill %1", "wait", destroy, ""])
    environ = {**os.environ, "PATH": f"{directory}{os.pathsep}{os.environ['PATH']}"}
    environ.pop("OPENAI_API_KEY", None)
    try:
        run = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=environ, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    finally:
        pid = tmp_path / "served.log.pid"
        if pid.exists() and not port_free():  # a tunnel the script left: this test's to end
            os.kill(int(pid.read_text()), 15)
    assert run.returncode == 0, run.stderr
    assert '"Hello!"' in run.stdout  # the API answered the README's request
    [request] = served.read_text().splitlines()
    assert request.startswith("/v1/chat/completions ") and '"Hello"' in request
    calls = log.read_text().splitlines()
    assert calls[0] == "uv sync" and calls[-1] == "pulumi destroy --stack aws-small"
    order = [c.split(" --")[0] for c in calls]
    assert (
        order.index("pulumi up")
        < order.index("uv run lrc wait")
        < order.index("aws ssm start-session")
    )
    assert port_free(), "`kill %1` ended the tunnel"

"""The commands that run the channel scripts on a main node, as every command channel sends them:
``llama-rpc-metrics`` (readings, for ``top`` and the cost run) and ``llama-rpc-bench`` (the cost
run's benchmark).

A script (infra/boot/channel_scripts/) travels in the command itself: a node installs it under
/run once per version, so any deployed stack can be read and benchmarked, whatever version booted
it, and no node carries them in its user data. The AWS stack also keeps the read command as an SSM
document of its own (``read_command``), which a watcher can be granted without being granted any
other command.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
from pathlib import Path

from infra.boot.installed import installed_text

SCRIPTS = Path(__file__).parent / "channel_scripts"
NAME = "llama-rpc-metrics"
SCRIPT = SCRIPTS / NAME
BENCH = "llama-rpc-bench"
# llama-rpc-bench's --prompt-words by default: llama-bench's prompt, in tokens.
BENCH_PROMPT_TOKENS = 128


@functools.cache
def _installer(name: str) -> str:
    """sh that installs the script (its comments left out, gzipped in base64) under /run unless
    this version is there, and runs it with the arguments it is given."""
    text = installed_text(SCRIPTS / name).encode()
    payload = base64.b64encode(gzip.compress(text, mtime=0)).decode()
    path = f"/run/{name}-{hashlib.sha256(text).hexdigest()[:12]}"
    return (
        # mktemp, not $$: systemd-run (the cost run's recorder) turns $$ into $.
        f'f={path}; [ -x "$f" ] || {{ t=$(mktemp "$f.XXXXXX") && printf %s {payload} '
        f'| base64 -d | gunzip > "$t" && chmod 0755 "$t" && mv "$t" "$f"; }} '
        f'&& exec python3 "$f" "$@"'
    )


def command(*args: str, script: str = NAME) -> list[str]:
    """The command line that runs ``script ARGS`` (llama-rpc-metrics by default) as root on a
    main node."""
    return ["sh", "-c", _installer(script), script, *args]


def bench_command(*args: str) -> list[str]:
    """The cost run's benchmark, ``llama-rpc-bench ARGS``, as root on a main node."""
    return command(*args, script=BENCH)


def read_command(max_chars: int | None = None) -> list[str]:
    """One reading, packed; over ``max_chars`` (the channel's cap) it fails and says so."""
    return command("read", "--pack", *(("--max-chars", str(max_chars)) if max_chars else ()))

"""Staged download: the main node's real tool (rclone, as fetch-model.sh runs it) reading one
object from a real S3 API (moto's server) through a proxy that caps each connection, as a cloud
caps each flow. The figure is the speed-up of STAGED_STREAMS ranged reads over one stream.

    sudo uv run python bench/fetch.py [--size-mib 128] [--cap-mibps 4] [--streams 16]

Everything runs inside a network namespace the benchmark makes and removes: nothing leaves it.
Writes bench/results/fetch.json (target: parallel_speedup >= 8 with 16 streams).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "fetch.json"
NAMESPACE = "lrc-fetch-bench"
S3_PORT, PROXY_PORT = 50992, 50993

# Each connection's answers are paced to the cap; requests pass as they come.
PROXY = """
import asyncio, sys, time
cap, upstream, listen = float(sys.argv[1]) * 1024 * 1024, int(sys.argv[2]), int(sys.argv[3])
async def pipe(reader, writer, paced):
    started, sent = time.monotonic(), 0
    try:
        while chunk := await reader.read(64 * 1024):
            writer.write(chunk)
            await writer.drain()
            if paced:
                sent += len(chunk)
                ahead = sent / cap - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    finally:
        writer.close()
async def serve(client_reader, client_writer):
    upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", upstream)
    await asyncio.gather(pipe(client_reader, upstream_writer, False),
                         pipe(upstream_reader, client_writer, True), return_exceptions=True)
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""

SETUP = """
import sys, time, urllib.request, boto3
url = f"http://127.0.0.1:{sys.argv[2]}"
for _ in range(100):
    try:
        urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                  aws_access_key_id="bench", aws_secret_access_key="bench")
s3.create_bucket(Bucket="models")
s3.upload_file(sys.argv[1], "models", "model.gguf")
"""


def inside(*argv: str) -> list[str]:
    return ["ip", "netns", "exec", NAMESPACE, *argv]


def copy_seconds(streams: int, size: int, target: Path) -> float:
    env = {
        "PATH": os.environ["PATH"],
        "RCLONE_CONFIG_STORE_TYPE": "s3",
        "RCLONE_CONFIG_STORE_PROVIDER": "Other",
        "RCLONE_CONFIG_STORE_ENDPOINT": f"http://127.0.0.1:{PROXY_PORT}",
        "RCLONE_CONFIG_STORE_REGION": "us-east-1",
        "RCLONE_CONFIG_STORE_ENV_AUTH": "true",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
    }
    target.unlink(missing_ok=True)
    # The same flags as fetch-model.sh; one stream: the cut-off above the object's size.
    cutoff = "1M" if streams > 1 else f"{size * 2}"
    started = time.monotonic()
    subprocess.run(
        inside(
            "rclone", "--config", "/dev/null", "copyto", "store:models/model.gguf", str(target),
            "--retries", "1", "--low-level-retries", "3",
            "--multi-thread-streams", str(streams), "--multi-thread-cutoff", cutoff,
        ),
        env=env, check=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert target.stat().st_size == size, "the copy is not the whole object"
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--cap-mibps", type=float, default=4.0)
    parser.add_argument("--streams", type=int, default=16)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the benchmark makes a network namespace: run it as root")
    size = args.size_mib * 1024 * 1024
    subprocess.run(["ip", "netns", "add", NAMESPACE], check=True)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run(["ip", "-n", NAMESPACE, "link", "set", "lo", "up"], check=True)
        moto = str(Path(sys.executable).parent / "moto_server")
        processes.append(subprocess.Popen(
            inside(moto, "-H", "127.0.0.1", "-p", str(S3_PORT)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        processes.append(subprocess.Popen(inside(
            sys.executable, "-c", PROXY, str(args.cap_mibps), str(S3_PORT), str(PROXY_PORT)
        )))  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp:
            source = Path(tmp) / "model.gguf"
            with source.open("wb") as out:
                block = os.urandom(1024 * 1024)
                for _ in range(args.size_mib):
                    out.write(block)
            subprocess.run(
                inside(sys.executable, "-c", SETUP, str(source), str(S3_PORT)), check=True
            )
            one = copy_seconds(1, size, Path(tmp) / "one.gguf")
            many = copy_seconds(args.streams, size, Path(tmp) / "many.gguf")
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", NAMESPACE], check=False)
    results = {
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "tool": subprocess.run(
            ["rclone", "version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0],
        "object_mib": args.size_mib,
        "cap_mibps_per_connection": args.cap_mibps,
        "streams": args.streams,
        "seconds_one_stream": round(one, 2),
        "seconds_parallel": round(many, 2),
        "mibps_one_stream": round(args.size_mib / one, 2),
        "mibps_parallel": round(args.size_mib / many, 2),
        "parallel_speedup": round(one / many, 2),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Demand-paged against sequential reads of a cold disk: how fast the main node's load reads a
model larger than its memory (infra/planner/serve.py, "load disk read").

    sudo uv run python bench/readahead.py [--size-mib 2048] [--repetitions 6]
                                          [--read-ahead-kb 128 16384] [--dir /var/tmp]

With patch 0003, a model larger than memory is mapped without MAP_POPULATE, so the load reads
the file by page faults (after POSIX_FADV_SEQUENTIAL), each worker's weights copied out of the
mapping by one thread, and every fault reads the file's read-ahead window around it;
fetch-model.sh raises that window on the model's disk. This measures, on one thread, a cold
device read

- ``mmap``: by copying 16 MiB pieces out of a shared mapping after POSIX_FADV_SEQUENTIAL (what the
  loader does), and
- ``read``: by read() of 16 MiB pieces (a sequential reader, the disk's own rate),

at each read-ahead given (the first is the kernel's default). The device is a loop device doing
direct I/O onto a file of random bytes in --dir, so every read reaches this machine's disk and
the machine's own disks keep their settings; its page cache is dropped before every read. The
arms run interleaved, in ABBA order (each round the reverse of the one before), and every
repetition is kept: per arm, and per round the ratio of each arm to ``read`` at the largest
read-ahead in that round, with median, min and max. The load average before and after says how
busy the machine was: run it on a quiet one.

Writes bench/results/readahead.json.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.rounds import interleaved, spread  # noqa: E402

RESULTS = REPO / "bench" / "results" / "readahead.json"
PIECE = 16 * 1024 * 1024
MIB = 1024**2
GB = 1e9
SECTOR = 512


def fill(path: Path, size: int) -> None:
    """``size`` random bytes (a sparse or repeated file would read from nowhere), on the disk."""
    with path.open("wb") as f:
        for _ in range(size // PIECE):
            f.write(os.urandom(PIECE))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def attach(backing: Path) -> str:
    """A loop device over ``backing`` that reads it with direct I/O (no second page cache)."""
    found = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", "--read-only", str(backing)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return found.stdout.strip()


def cold(device: str, read_ahead_kb: int) -> None:
    """Sets the device's read-ahead and drops what the page cache holds of it."""
    subprocess.run(["blockdev", "--setra", str(read_ahead_kb * 1024 // SECTOR), device], check=True)
    subprocess.run(["blockdev", "--flushbufs", device], check=True)
    fd = os.open(device, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_seconds(device: str, size: int) -> float:
    buffer = bytearray(PIECE)
    fd = os.open(device, os.O_RDONLY)
    try:
        started = time.perf_counter()
        done = 0
        while done < size:
            got = os.readv(fd, [memoryview(buffer)[: min(PIECE, size - done)]])
            if got <= 0:
                raise RuntimeError(f"{device} ended at byte {done} of {size}")
            done += got
        return time.perf_counter() - started
    finally:
        os.close(fd)


def mmap_seconds(device: str, size: int) -> float:
    buffer = bytearray(PIECE)
    fd = os.open(device, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # as llama_mmap does
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        try:
            view = memoryview(mapped)
            started = time.perf_counter()
            for offset in range(0, size, PIECE):
                end = min(offset + PIECE, size)
                buffer[: end - offset] = view[offset:end]  # one thread's copy, page by page
            seconds = time.perf_counter() - started
            view.release()
        finally:
            mapped.close()
        return seconds
    finally:
        os.close(fd)


READERS = {"mmap": mmap_seconds, "read": read_seconds}


def run(device: str, size: int, read_aheads: list[int], repetitions: int) -> dict[str, object]:
    arms = [(how, kb) for kb in read_aheads for how in READERS]
    reference = ("read", max(read_aheads))
    order: list[dict[str, object]] = []
    rates: dict[tuple[str, int], list[float]] = {arm: [] for arm in arms}
    ratios: dict[tuple[str, int], list[float]] = {arm: [] for arm in arms if arm != reference}
    for repetition, (how, kb) in interleaved(arms, repetitions):
        cold(device, kb)
        gbps = size / READERS[how](device, size) / GB
        rates[how, kb].append(gbps)
        order.append({"round": repetition, "arm": f"{how}@{kb}", "gbps": round(gbps, 4)})
        print(f"round {repetition} {how} read-ahead {kb} KiB: {gbps:.3f} GB/s", file=sys.stderr)
    for arm, values in ratios.items():
        values.extend(a / b for a, b in zip(rates[arm], rates[reference], strict=True))
    return {
        "arms": {f"{how}@{kb}": spread(values) for (how, kb), values in rates.items()},
        "reference": f"{reference[0]}@{reference[1]}",
        "over_reference": {f"{how}@{kb}": spread(values) for (how, kb), values in ratios.items()},
        "order": order,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--repetitions", type=int, default=6)
    parser.add_argument("--read-ahead-kb", type=int, nargs="+", default=[128, 16384])
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("a loop device and its read-ahead need root: run it with sudo")
    size = args.size_mib * MIB // PIECE * PIECE
    if size == 0:
        sys.exit(f"--size-mib is at least {PIECE // MIB}")
    with tempfile.TemporaryDirectory(prefix="bench-readahead-", dir=args.dir) as tmp:
        backing = Path(tmp) / "disk.img"
        fill(backing, size)
        device = attach(backing)
        try:
            load_before = os.getloadavg()
            measured = run(device, size, args.read_ahead_kb, args.repetitions)
            load_after = os.getloadavg()
        finally:
            subprocess.run(["losetup", "--detach", device], check=False)
    source = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", str(args.dir)],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "arch": platform.machine(),
            "kernel": platform.release(),
        },
        "device": f"loop device, direct I/O onto a file on {source or args.dir}",
        "size_mib": size // MIB,
        "piece_mib": PIECE // MIB,
        "repetitions": args.repetitions,
        "read_ahead_kb": args.read_ahead_kb,
        "load_average": {"before": list(load_before), "after": list(load_after)},
        **measured,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "order"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

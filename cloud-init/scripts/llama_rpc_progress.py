"""llama-rpc-status's progress readers, which only a main node runs: a download's bytes (curl's
partial files and headers, rclone's stats) and a load's (the acknowledged bytes of the
connections to the workers). A worker does not get this module."""

import re
from pathlib import Path

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
RCLONE_STATS = re.compile(r"NOTICE: +([\d.]+) (\w+) / ([\d.]+) (\w+), ")
WHOLE = re.compile(r"^\S+ 200\b.*^content-length: *(\d+)", re.I | re.M | re.S)
RANGE = re.compile(r"^content-range: *bytes \d+-\d+/(\d+)", re.I | re.M)


def size_of(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


def part_progress(scratch: Path, index: int, part: Path) -> tuple[int, int | None]:
    """One part's bytes done, and in all when known: the whole file; rclone's count; or the
    .partial file against the size the last response announced (a redirect's does not count)."""
    if (whole := size_of(part)) is not None:
        return whole, whole
    if stats := RCLONE_STATS.findall(read_text(scratch / f"{index}.rclone")):
        done, unit, total, total_unit = stats[-1]
        size = round(float(total) * UNITS.get(total_unit, 0))
        return min(round(float(done) * UNITS.get(unit, 0)), size), size
    done = size_of(part.with_name(part.name + ".partial")) or 0
    last = "HTTP/" + read_text(scratch / f"{index}.headers").rsplit("HTTP/", 1)[-1]
    found = RANGE.search(last) or WHOLE.search(last)
    return done, int(found.group(1)) if found else None


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def download_progress(scratch: Path, parts: list[str]) -> dict[str, object]:
    done = [part_progress(scratch, i, Path(part)) for i, part in enumerate(parts)]
    sizes = [size for _, size in done]
    total = None if None in sizes else sum(size or 0 for size in sizes)
    return {"download_done_bytes": sum(d for d, _ in done), "download_total_bytes": total}


def load_progress(ss_output: str, workers: str, planned: int) -> dict[str, object]:
    """Bytes this node's TCP connections to the workers have had acknowledged: during the load,
    the weights on their way to the workers."""
    peers, sent, peer = set(workers.split(",")), 0, None
    for line in ss_output.splitlines():
        if not line[:1].isspace():
            fields = line.split()
            peer = fields[-1] if len(fields) >= 4 else None
        elif peer in peers and (acked := re.search(r"\bbytes_acked:(\d+)", line)):
            sent += max(0, int(acked.group(1)) - 1)  # the SYN counts as one
    return {"load_sent_bytes": sent, "load_total_bytes": planned}

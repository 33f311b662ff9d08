"""A main node's half of llama-rpc-slice (which imports it from the script it runs as): the
header and the main node's own tensors written into a sparse copy of each part, and the lists
llama-server reads. A worker's user data does not carry it (AWS's 16 KB)."""

import functools
import os
from pathlib import Path

from __main__ import SliceError, fetch_pieces, holds, key_of, sha256_of


def worker_tensors(manifest, main_layers):
    """Every tensor a worker holds: the layers past the main node's, the output head, and the
    embeddings where the output is tied to them."""
    tied = manifest["tied_output"]
    for index, part in enumerate(manifest["parts"]):
        for tensor in part["tensors"]:
            if holds(tensor, main_layers, 1 << 30, True, tied):
                yield index, tensor


def own(tensor, main_layers, tied):
    """Whether the main node holds ``tensor``: the embeddings and its layers."""
    return tensor["home"] == "input" or holds(tensor, 0, main_layers, False, tied)


def put_at(fd, piece, at, data):
    """A piece's bytes where they are in the part: the copy keeps the file's offsets."""
    os.pwrite(fd, data, piece[0] + at)


def put_main_slice(manifest, sources, outputs, *, keys_file, elsewhere_file, main_layers, pool):
    tied = manifest["tied_output"]
    remote = {t["name"]: t for _, t in worker_tensors(manifest, main_layers)}
    fetched = 0
    for index, part in enumerate(manifest["parts"]):
        out = Path(outputs[index])
        done = out.with_name(out.name + ".slice")
        mine = [t for t in part["tensors"] if own(t, main_layers, tied)]
        if out.is_file() and done.is_file() and done.read_text() == part["sha256"]:
            continue
        partial = out.with_name(out.name + ".partial")
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.ftruncate(fd, part["size"])  # a sparse file: the workers' ranges stay holes
            ranges = [(0, part["header_size"], "header", part["header_sha256"])]
            ranges += [(t["offset"], t["size"], t["name"], t["sha256"]) for t in mine]
            fetch_pieces(sources[index], ranges, functools.partial(put_at, fd), pool)
            for offset, size, name, digest in ranges:
                if sha256_of(fd, offset, size) != digest:
                    raise SliceError(
                        f"{name}: its bytes from {sources[index]} do not match the slice "
                        "manifest's sha256"
                    )
                fetched += size
            os.fsync(fd)
        except BaseException:
            os.unlink(partial)
            raise
        finally:
            os.close(fd)
        os.rename(partial, out)
        done.write_text(part["sha256"])
    held = {t["name"] for part in manifest["parts"] for t in part["tensors"]
            if own(t, main_layers, tied)}  # fmt: skip
    keyed = sorted(remote.items())
    keys_file.write_text("".join(f"{n} {t['size']} {key_of(t)}\n" for n, t in keyed))
    elsewhere_file.write_text("".join(f"{n}\n" for n in sorted(remote) if n not in held))
    return {"tensors": len(held), "fetched_bytes": fetched, "keyed": len(remote),
            "keyed_bytes": sum(t["size"] for t in remote.values())}  # fmt: skip

"""``lrc prebuild``: the pinned llama.cpp with its patch set built once for a CPU target, checked,
packed and put in the stack's object store, where the nodes fetch it instead of building
(``infra.boot.prebuilt`` names the bundle and its key).

The build is ``build-llama.sh``'s, for every role, cached on this machine per target beside the
local cluster's: for an Arm family with Debian's cross toolchain (``LLAMA_CROSS``) and the
family's -march, for this machine's own CPU natively. Each program must start before it is
packed: an Arm one under ``qemu-user`` on another machine.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra.boot.prebuilt import BUNDLE_PROGRAMS, SHA256_SUFFIX, bundle_key
from infra.boot.render import SCRIPTS_DIR
from infra.live import StageError, Store
from infra.stage.upload import copy_file

# The GNU triplet of each machine a cross toolchain builds for (Debian's crossbuild-essential-*).
CROSS_TRIPLETS = {"aarch64": "aarch64-linux-gnu"}
RUN_SECONDS = 60  # a program's --version, under emulation too


@dataclass(frozen=True)
class Build:
    """What to build: the commit, its patch set's digest, and for which target."""

    commit: str
    patches: str
    target: str
    machine: str  # aarch64, x86_64
    march: str = ""  # a family's -march; "": this machine's own CPU


def bin_dir(prefix: Path, commit: str) -> Path:
    """Where build-llama.sh installs the programs under ``prefix`` (lib.sh's llama_bin_dir)."""
    return prefix / commit / "bin"


def build(spec: Build, prefix: Path, source: Path, log: Path) -> Path:
    """Build every role's programs under ``prefix`` (skipped when they are there, as on a node);
    the directory that holds them."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LLAMA_RPC_ENV_FILE": "/dev/null",
        "LLAMA_ROLE": "all",
        "LLAMA_CPP_COMMIT": spec.commit,
        "LLAMA_CPP_SOURCE": str(source),
        "LLAMA_CPP_PATCHES": spec.patches,
        "LLAMA_PREFIX": str(prefix),
        "LLAMA_DATA_DIR": str(log.parent / "prebuild-status"),
    }
    if spec.march:
        env["LLAMA_CPU_ARCH"] = spec.march
    if spec.machine != platform.machine():
        triplet = CROSS_TRIPLETS.get(spec.machine)
        if triplet is None or shutil.which(f"{triplet}-g++") is None:
            raise StageError(
                f"no cross compiler for {spec.machine} here: install Debian's "
                f"crossbuild-essential-{'arm64' if spec.machine == 'aarch64' else spec.machine}"
            )
        env["LLAMA_CROSS"] = triplet
    with log.open("w") as said:
        result = subprocess.run(
            ["bash", str(SCRIPTS_DIR / "build-llama.sh")],
            env=env, stdout=subprocess.DEVNULL, stderr=said, check=False,
        )  # fmt: skip
    if result.returncode != 0:
        raise StageError(f"the llama.cpp build failed: {log.read_text().strip()[-600:]}")
    return bin_dir(prefix, spec.commit)


def runner(machine: str) -> list[str]:
    """What runs a program built for ``machine`` here: nothing, or qemu-user with that machine's
    libraries (Debian's cross toolchain puts them in /usr/TRIPLET)."""
    if machine == platform.machine():
        return []
    qemu = shutil.which(f"qemu-{machine}")
    if qemu is None or machine not in CROSS_TRIPLETS:
        raise StageError(
            f"cannot run {machine} programs here to check them: install Debian's qemu-user"
        )
    return [qemu, "-L", f"/usr/{CROSS_TRIPLETS[machine]}"]


def stamp_problem(programs: Path, spec: Build) -> str | None:
    """Why the build's stamp (build-llama.sh's ``.built``: the commit, the CMake flags and the
    patch set) says these programs are not ``spec``'s, or None (no stamp: programs built
    elsewhere, which whoever gives them vouches for)."""
    stamp = programs / ".built"
    if not stamp.is_file():
        return None
    lines = stamp.read_text().splitlines()
    flags = lines[1].split() if len(lines) > 1 else []
    cpu = f"-DGGML_CPU_ARM_ARCH={spec.march}" if spec.march else "-DGGML_NATIVE=ON"
    if lines[:1] != [spec.commit] or f"patches {spec.patches}" not in lines or cpu not in flags:
        return (
            f"{stamp} says these programs are another build ({' / '.join(lines)}), not "
            f"llama.cpp {spec.commit[:12]} with patch set {spec.patches} for {spec.target}"
        )
    return None


def check_runs(programs: Path, machine: str) -> list[str]:
    """Each program of the bundle starts and says what it is (``--version``; ggml-rpc-server,
    which has none, ``--help``); the first line each said."""
    said = []
    prefix = runner(machine)
    for name in BUNDLE_PROGRAMS:
        path = programs / name
        if not path.is_file() or path.is_symlink():
            raise StageError(f"{programs} holds no {name}: build every role's programs")
        flag = "--help" if name == "ggml-rpc-server" else "--version"
        try:
            result = subprocess.run(
                [*prefix, str(path), flag], capture_output=True, text=True,
                timeout=RUN_SECONDS, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            raise StageError(f"{path} does not run here: {error}") from None
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
            raise StageError(f"{path} {flag} failed (exit {result.returncode}): {tail[0]}")
        lines = (result.stderr + result.stdout).strip().splitlines()
        said.append(f"{name}: {next((ln for ln in lines if 'version' in ln), lines[0])}")
    return said


def pack(programs: Path, out: Path) -> str:
    """The bundle: ``bin/`` with every role's programs, the same bytes from the same programs
    (sorted, owned by root, no times); its sha256."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        tree = Path(work) / "bin"
        tree.mkdir()
        for name in BUNDLE_PROGRAMS:
            shutil.copyfile(programs / name, tree / name)
            (tree / name).chmod(0o755)
        partial = out.with_name(out.name + ".partial")
        subprocess.run(
            ["tar", "--zstd", "-cf", str(partial), "-C", work, "--sort=name", "--owner=0",
             "--group=0", "--numeric-owner", "--mtime=@0", "bin"],
            check=True,
        )  # fmt: skip
        partial.replace(out)
    digest = hashlib.sha256()
    with out.open("rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def upload(store: Store, bundle: Path, spec: Build, prefix: str = "") -> tuple[str, str]:
    """The bundle and then its ``.sha256`` into the store (a node that finds the checksum finds
    the whole bundle): its URL and sha256."""
    key = bundle_key(spec.commit, spec.patches, spec.target, prefix)
    digest = copy_file(store, bundle, key)
    with tempfile.TemporaryDirectory() as work:
        line = Path(work) / "sha256"
        line.write_text(f"{digest}  {key.rsplit('/', 1)[-1]}\n")
        copy_file(store, line, key + SHA256_SUFFIX)
    print(f"put {store.url(key)} (sha256 {digest})", file=sys.stderr)
    return store.url(key), digest

"""The prebuilt llama.cpp: `lrc prebuild` packs and uploads a bundle into a real S3 API on loopback
(moto's server), and build-llama.sh on this machine fetches it with the node's tool (rclone),
checks it and uses it instead of building, or builds when the store has none for it, its sha256
is not the bundle's, or it does not run here."""

from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from infra.boot.node import NodeBoot
from infra.boot.patches import patches_digest
from infra.boot.prebuilt import (
    BUNDLE_PROGRAMS,
    bundle_key,
    bundle_url,
    family_target,
    native_target,
    prebuilt_problem,
)
from infra.boot.render import cloud_config
from infra.cli import prebuild as prebuild_command
from infra.core.pins import LLAMA_CPP_COMMIT
from infra.live.aws import S3Store
from infra.local.options import build_prefix
from infra.local.source import cache_dir
from infra.stack.files import stack_config
from infra.stage import prebuilt
from tests.boot.test_scripts import git_repo
from tests.conftest import LRC, REPO, free_port, pinned_llama_binary, require_tool, unavailable

REGION = "us-east-1"
BUCKET = "lrc"
TARGET = "x86_64-test"


@dataclass(frozen=True)
class Store:
    endpoint: str
    s3: object  # a boto3 client

    def env(self) -> dict[str, str]:
        """What a node (and the person uploading) is given to reach it."""
        return {
            "MODEL_STORE_REGION": REGION,
            "MODEL_STORE_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
        }


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client(
            "s3", region_name=REGION, endpoint_url=endpoint,
            aws_access_key_id="test", aws_secret_access_key="test",
        )  # fmt: skip
        s3.create_bucket(Bucket=BUCKET)
        yield Store(endpoint, s3)
    finally:
        server.stop()


def own_target() -> str:
    """A target of a test's own: stand-in commits made in the same second are the same commit."""
    return f"x86_64-test{uuid.uuid4().hex[:12]}"


# A program that says what it is, as llama.cpp's do (ggml-rpc-server on --help).
PROGRAM = '#!/bin/sh\necho "version: 1 (test build of $(basename "$0"))"\n'


def programs(directory: Path, body: str = PROGRAM, **bodies: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in BUNDLE_PROGRAMS:
        (directory / name).write_text(bodies.get(name, body))
        (directory / name).chmod(0o755)
    return directory


def uploaded(store: Store, tmp_path: Path, commit: str, target: str = TARGET, **bodies: str) -> str:
    """A bundle of stand-in programs for ``commit`` (unpatched) in the store; its sha256."""
    spec = prebuilt.Build(commit, "none", target, platform.machine())
    bundle = tmp_path / "bundle.tar.zst"
    prebuilt.pack(programs(tmp_path / "programs", **bodies), bundle)
    _, digest = prebuilt.upload(S3Store(store.s3, BUCKET), bundle, spec, "nodes/")
    return digest


def boot_build(  # noqa: PLR0917 (a test's helper)
    run_script, store: Store, tmp_path: Path, commit: str, repo: Path, target: str, **more: str
):
    """build-llama.sh as a worker with the store's bundles (LLAMA_PREBUILT) for ``target``, its
    source the stand-in repository (whose build fails: it is no llama.cpp) and no patch set."""
    (tmp_path / "no-patches").mkdir(exist_ok=True)
    settings = {
        "LLAMA_ROLE": "worker", "LLAMA_CPP_COMMIT": commit, "LLAMA_CPP_SOURCE": str(repo),
        "LLAMA_CPP_PATCH_DIR": str(tmp_path / "no-patches"),
        "LLAMA_PREBUILT": f"s3://{BUCKET}/nodes", "LLAMA_PREBUILT_TARGET": target,
        **store.env(), **more,
    }  # fmt: skip
    return run_script("build-llama.sh", **settings)


def test_a_node_uses_the_stores_bundle_and_builds_nothing(run_script, store, tmp_path) -> None:
    repo, head = git_repo(tmp_path)
    target = own_target()
    digest = uploaded(store, tmp_path, head, target)
    result, status = boot_build(run_script, store, tmp_path, head, repo, target)
    assert result.returncode == 0, result.stderr
    url = bundle_url(f"s3://{BUCKET}/nodes", head, "none", target)
    assert f"using prebuilt llama.cpp {url} (sha256 {digest})" in result.stderr
    assert status["build_source"] == "prebuilt" and status["prebuilt_sha256"] == digest
    assert status["prebuilt_url"] == url and "prebuilt_fallback" not in status
    installed = tmp_path / "prefix" / head / "bin"
    ran = subprocess.run([installed / "ggml-rpc-server", "--help"], capture_output=True, text=True)
    assert ran.stdout == "version: 1 (test build of ggml-rpc-server)\n"
    assert not (tmp_path / "prefix" / head / "src").exists()  # nothing fetched, nothing built
    assert not (tmp_path / "prefix" / head / "prebuilt").exists()  # its scratch is gone
    # A reboot: the bundle is there, checked by its stamp; nothing is read again.
    result, status = boot_build(run_script, store, tmp_path, head, repo, target)
    assert result.returncode == 0 and "already built" in result.stderr
    assert status["build_skipped"] is True


@pytest.mark.parametrize("fault", ["none", "sha256", "exec", "symlink"])
def test_a_node_builds_when_the_bundle_is_missing_wrong_or_does_not_run(
    run_script, store, tmp_path, fault: str
) -> None:
    """Each fault falls back to the node's own build (here the stand-in's, which fails after
    the fetch: it is no llama.cpp), says why, and installs nothing of the bundle."""
    repo, head = git_repo(tmp_path)
    target = own_target()
    key = bundle_key(head, "none", target, "nodes/")
    if fault == "sha256":
        uploaded(store, tmp_path, head, target)
        store.s3.put_object(Bucket=BUCKET, Key=f"{key}.sha256", Body=f"{'0' * 64}  x\n".encode())
        says = "its .sha256 says '" + "0" * 64
    elif fault == "exec":  # built for another machine: not a program this one runs
        uploaded(store, tmp_path, head, target, **{"ggml-rpc-server": "\x7fELF not for here"})
        says = "its ggml-rpc-server does not run on this node"
    elif fault == "symlink":  # a member that points elsewhere is never installed or followed
        members = io.BytesIO()
        with tarfile.open(fileobj=members, mode="w") as tar:
            link = tarfile.TarInfo("bin/ggml-rpc-server")
            link.type, link.linkname = tarfile.SYMTYPE, "/bin/true"
            tar.addfile(link)
        bundle = tmp_path / "link.tar.zst"
        subprocess.run(["zstd", "-q", "-o", str(bundle)], input=members.getvalue(), check=True)
        body = bundle.read_bytes()
        store.s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        digest = hashlib.sha256(body).hexdigest()
        store.s3.put_object(Bucket=BUCKET, Key=f"{key}.sha256", Body=f"{digest}  x\n".encode())
        says = "holds no bin/ggml-rpc-server"
    else:
        says = f"none at s3://{BUCKET}/{key}"
    result, status = boot_build(run_script, store, tmp_path, head, repo, target)
    assert result.returncode == 1, result.stderr
    assert says in status["prebuilt_fallback"], status
    assert "building it on this node" in result.stderr
    assert status["build_source"] == "built" and "llama.cpp build failed" in status["last_error"]
    assert (tmp_path / "prefix" / head / "src" / "README").exists()  # the build path ran
    assert not (tmp_path / "prefix" / head / "bin").exists()
    assert not (tmp_path / "prefix" / head / "prebuilt").exists()


def test_settings_that_name_no_store_or_target_are_refused() -> None:
    assert prebuilt_problem("s3://lrc/nodes", family_target("aarch64", "armv9-a+sve2")) is None
    assert "not an object store prefix" in (prebuilt_problem("https://x/y", TARGET) or "")
    assert "is not a machine and a CPU" in (prebuilt_problem("s3://lrc", "a/b+c") or "")
    with pytest.raises(ValueError, match="model_store_region"):
        NodeBoot(role="worker", node_ip="10.0.1.11", rpc_allowed_sources=("10.0.1.10/32",),
                 prebuilt_store="s3://lrc/nodes", prebuilt_target=TARGET)  # fmt: skip


def test_a_node_with_a_prebuilt_store_gets_its_fetch_and_the_store_settings() -> None:
    """Every role reads the store then: a worker too gets rclone, zstd, the fetch and the
    region; a node without one gets none of them."""
    worker = NodeBoot(
        role="worker", node_ip="10.0.1.11", rpc_allowed_sources=("10.0.1.10/32",),
        prebuilt_store="s3://lrc/nodes", prebuilt_target=TARGET, model_store_region=REGION,
    )  # fmt: skip
    config = cloud_config(worker)
    assert {"rclone", "zstd"} <= set(config["packages"])
    paths = {file["path"].rsplit("/", 1)[-1]: file for file in config["write_files"]}
    assert paths["fetch-llama.sh"]["permissions"] == "0644"  # sourced by build-llama.sh
    assert "store-remote.sh" in paths and "fetch-staged.sh" not in paths  # no model here
    env = worker.env()
    assert env["LLAMA_PREBUILT"] == "s3://lrc/nodes" and env["LLAMA_PREBUILT_TARGET"] == TARGET
    assert env["MODEL_STORE_REGION"] == REGION
    plain = NodeBoot(role="worker", node_ip="10.0.1.11", rpc_allowed_sources=("10.0.1.10/32",),
                     model_store_region=REGION)  # fmt: skip
    names = {file["path"].rsplit("/", 1)[-1] for file in cloud_config(plain)["write_files"]}
    assert "fetch-llama.sh" not in names and "zstd" not in cloud_config(plain)["packages"]
    assert not {"LLAMA_PREBUILT", "MODEL_STORE_REGION"} & set(plain.env())


def native_build() -> Path:
    """This machine's pinned build (``lrc local up`` makes it) when it is of this tree's patch
    set, as its stamp says."""
    built = pinned_llama_binary("llama-server").parent
    stamp = (built / ".built").read_text().splitlines()
    if f"patches {patches_digest(LLAMA_CPP_COMMIT)}" not in stamp:
        unavailable(f"{built} is a build of another patch set ({stamp[-1]}): `lrc local up` builds")
    return built


def prebuild(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **store.env()}
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CA_BUNDLE"):
        env.pop(name, None)
    return subprocess.run(
        [LRC, "prebuild", "--endpoint", store.endpoint, "--region", REGION, "--bucket", BUCKET,
         *args],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
    )  # fmt: skip


def test_prebuild_uploads_this_machines_build_and_a_node_runs_it(
    run_script, store, tmp_path
) -> None:
    """`lrc prebuild --native`: the pinned build of this machine (the local cluster's, whose
    machines share this CPU), checked, packed and uploaded under the key a node reads; a node of
    the pinned commit and patch set then runs the real programs, fetched, and builds nothing."""
    # Packed as it is (--bin): a test never builds into the cache it shares.
    built = str(native_build())
    made = prebuild(store, "--native", "--bin", built, "--prefix", "real/")
    assert made.returncode == 0, made.stderr
    patches = patches_digest(LLAMA_CPP_COMMIT)
    target = native_target(platform.machine(), build_prefix(cache_dir()).name)
    key = bundle_key(LLAMA_CPP_COMMIT, patches, target, "real/")
    body = store.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    digest = hashlib.sha256(body).hexdigest()
    line = store.s3.get_object(Bucket=BUCKET, Key=f"{key}.sha256")["Body"].read().decode()
    assert line == f"{digest}  {key.rsplit('/', 1)[-1]}\n"
    assert f"store: s3://{BUCKET}/real\n" in made.stdout and f"sha256: {digest}" in made.stdout
    assert "runs: llama-server: version:" in made.stderr
    again = prebuild(store, "--native", "--bin", built, "--prefix", "real/")
    assert again.returncode == 0 and f"have s3://{BUCKET}/{key}" in again.stderr
    result, status = run_script(
        "build-llama.sh", LLAMA_ROLE="main", LLAMA_CPP_COMMIT=LLAMA_CPP_COMMIT,
        LLAMA_CPP_SOURCE=str(tmp_path / "never-read"), LLAMA_PREBUILT=f"s3://{BUCKET}/real",
        LLAMA_PREBUILT_TARGET=target, LLAMA_CPP_PATCHES=patches, timeout=120, **store.env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert status["build_source"] == "prebuilt" and status["prebuilt_sha256"] == digest
    server = tmp_path / "prefix" / LLAMA_CPP_COMMIT / "bin" / "llama-server"
    said = subprocess.run([server, "--version"], capture_output=True, text=True)
    assert f"commit {LLAMA_CPP_COMMIT[:7]}" in said.stderr + said.stdout


def test_prebuild_refuses_programs_whose_stamp_names_another_build(store, tmp_path) -> None:
    """A build directory whose stamp (build-llama.sh's) names another patch set is not packed
    under this one's key: a node would run sources its settings do not name."""
    given = programs(tmp_path / "other")
    stamp = f"{LLAMA_CPP_COMMIT}\n-G Ninja -DGGML_NATIVE=ON\npatches 0123456789abcdef\n"
    (given / ".built").write_text(stamp)
    made = prebuild(store, "--native", "--bin", str(given), "--prefix", "other/")
    assert made.returncode == 1 and "says these programs are another build" in made.stderr
    assert f"patch set {patches_digest(LLAMA_CPP_COMMIT)}" in made.stderr
    ours = stamp.replace("0123456789abcdef", patches_digest(LLAMA_CPP_COMMIT))
    (given / ".built").write_text(ours)
    made = prebuild(store, "--native", "--bin", str(given), "--prefix", "other/")
    assert made.returncode == 0, made.stderr


def test_prebuild_refuses_programs_that_do_not_run(store, tmp_path) -> None:
    broken = programs(tmp_path / "broken", **{"llama-bench": "#!/bin/sh\nexit 3\n"})
    made = prebuild(store, "--native", "--bin", str(broken), "--prefix", "broken/")
    assert made.returncode == 1 and "llama-bench --version failed (exit 3)" in made.stderr
    listed = store.s3.list_objects_v2(Bucket=BUCKET, Prefix="broken/").get("KeyCount", 0)
    assert listed == 0


@pytest.mark.slow
def test_an_arm_family_is_cross_built_and_runs_under_emulation(run_script, store, tmp_path) -> None:
    """Graviton4's bundle, cross-built with Debian's toolchain (minutes, once: it is cached), its
    programs run under qemu-user before packing; what is packed is aarch64 code. A node of
    another machine (this one) fetches it, finds it whole, and builds instead: it does not run."""
    made = subprocess.run(
        [LRC, "prebuild", "--family", "graviton4", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=3 * 3600, check=False, cwd=REPO,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    target = family_target("aarch64", "armv9-a+sve2+bf16+i8mm")
    assert f"target: {target}" in made.stdout and "runs: llama-server: version:" in made.stderr
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "--zstd", "-xf", str(tmp_path / f"{target}.tar.zst"), "-C",
                    str(unpacked)], check=True)  # fmt: skip
    for name in BUNDLE_PROGRAMS:
        header = (unpacked / "bin" / name).read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183, name
    march = "armv9-a+sve2+bf16+i8mm"
    spec = prebuilt.Build(LLAMA_CPP_COMMIT, patches_digest(LLAMA_CPP_COMMIT), target, "aarch64",
                          march)  # fmt: skip
    url, _ = prebuilt.upload(
        S3Store(store.s3, BUCKET), tmp_path / f"{target}.tar.zst", spec, "arm/"
    )
    # The build it falls back to: a source that is not there, which it says at once.
    result, status = run_script(
        "build-llama.sh", LLAMA_ROLE="worker", LLAMA_CPP_COMMIT=LLAMA_CPP_COMMIT,
        LLAMA_CPP_SOURCE=str(tmp_path / "no-source"), LLAMA_PREBUILT=f"s3://{BUCKET}/arm",
        LLAMA_PREBUILT_TARGET=target, LLAMA_CPP_PATCHES=spec.patches, GIT_FETCH_ATTEMPTS="1",
        timeout=120, **store.env(),
    )  # fmt: skip
    assert status["prebuilt_url"] == url and "prebuilt_sha256" not in status
    said = f"its ggml-rpc-server does not run on this node ({platform.machine()})"
    assert status["prebuilt_fallback"] == said, result.stderr
    assert status["build_source"] == "built" and result.returncode != 0
    assert not (tmp_path / "prefix" / LLAMA_CPP_COMMIT / "bin").exists()


def test_programs_of_another_machine_are_never_packed_as_an_arm_familys(tmp_path) -> None:
    """This machine's x86-64 build given as Graviton4's (--bin): run under qemu-user's aarch64
    first, it fails, and nothing is packed."""
    require_tool("qemu-aarch64")
    given = tmp_path / "given"
    given.mkdir()
    shutil.copy(pinned_llama_binary("ggml-rpc-server"), given)  # the first it runs; no stamp
    out = tmp_path / "out"
    made = subprocess.run(
        [LRC, "prebuild", "--family", "graviton4", "--bin", str(given), "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert made.returncode == 1, made.stderr
    assert "ggml-rpc-server --help failed" in made.stderr
    assert "Invalid ELF image for this architecture" in made.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("stack", "target"),
    [
        ("aws-c8g", "aarch64-armv9-a_sve2_bf16_i8mm"),  # Graviton4
        ("aws-c7g", "aarch64-armv8.4-a_sve_bf16_i8mm_dotprod_crypto"),  # Graviton3
        ("azure-cobalt", "aarch64-armv9-a_sve2_bf16_i8mm"),  # Cobalt 100 shares Graviton4's
    ],
)
def test_a_stack_is_built_for_its_cpu_family_in_its_cloud_and_region(
    stack: str, target: str
) -> None:
    args = prebuild_command.parser().parse_args(["--stack", stack, "--bucket", "b"])
    asked = prebuild_command.asked(args)
    config = stack_config(stack)
    assert asked.spec.target == target and asked.spec.machine == "aarch64"
    assert (asked.cloud, asked.region) == (config.cloud, config.region)
    assert asked.spec.patches == patches_digest(config.llama_cpp_commit)
    assert asked.prefix == cache_dir() / "llama.cpp" / target

"""lrc prebuild: build the pinned llama.cpp once for a CPU target and put it in the object store.

    lrc prebuild --stack aws-c8g --bucket my-models            (the stack's CPU family)
    lrc prebuild --family graviton3 --region us-east-1 --bucket my-models
    lrc prebuild --native --region us-east-1 --bucket my-models --endpoint http://…  (this CPU)
    lrc prebuild --family axion --out dist/                     (pack only)

The pinned commit with its patch set, every role's programs (build-llama.sh, cached on this
machine per target): an Arm family is cross-built with Debian's cross toolchain
(crossbuild-essential-arm64) for its -march, and each program is run once under qemu-user
before it is packed; --bin packs programs built elsewhere instead, after the same check. The
bundle goes to PREFIX/llama.cpp/COMMIT/PATCHES/TARGET.tar.zst beside its .sha256; a node whose
stack names the store (PREFIX) fetches it, checks it and runs it instead of building.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.cli.options import add_cloud, add_stack, command_parser, json_option, print_json
from infra.live import LIVE, LiveError, StageError


class _Refused(Exception):
    """A mistake in what was asked (exit 2)."""


@dataclass(frozen=True)
class _Asked:
    cloud: str
    region: str | None
    spec: Any  # infra.stage.prebuilt.Build
    prefix: Path  # where this machine caches the target's build


def parser() -> argparse.ArgumentParser:
    from infra.stack.kube.image import CPU_ARCH  # noqa: PLC0415

    parser = command_parser("prebuild", __doc__.splitlines()[0], [json_option()])
    which = parser.add_mutually_exclusive_group(required=True)
    add_stack(which, "for this stack's CPU family, in its cloud and region")
    which.add_argument("--family", choices=sorted(CPU_ARCH), help="an Arm CPU family")
    which.add_argument("--native", action="store_true", help="this machine's own CPU")
    parser.add_argument("--region", help="the region of the stacks that will read it")
    add_cloud(parser, LIVE, "the stacks' cloud (default aws)")
    parser.add_argument(
        "--bucket", help="an existing bucket there (Blob Storage: ACCOUNT/CONTAINER)"
    )
    parser.add_argument("--prefix", default="", help="a key prefix, e.g. lrc/")
    parser.add_argument(
        "--endpoint", help="another S3 API, a Cloud Storage emulator, or a Blob endpoint URL"
    )
    parser.add_argument("--bin", type=Path, help="pack these programs instead of building them")
    parser.add_argument(
        "--source", type=Path, help="the llama.cpp tree (default: the pinned sdist's)"
    )
    parser.add_argument("--out", type=Path, help="also keep the bundle in this directory")
    return parser


def asked(args: argparse.Namespace) -> _Asked:
    """The build asked for: its commit and target, and the store's cloud and region."""
    from infra.boot.patches import patches_digest  # noqa: PLC0415
    from infra.boot.prebuilt import family_target, native_target  # noqa: PLC0415
    from infra.core.pins import LLAMA_CPP_COMMIT  # noqa: PLC0415
    from infra.local.options import build_prefix  # noqa: PLC0415
    from infra.local.source import cache_dir  # noqa: PLC0415
    from infra.stack.kube.image import CPU_ARCH, cpu_arch  # noqa: PLC0415
    from infra.stage.prebuilt import Build  # noqa: PLC0415

    commit, cloud, region = LLAMA_CPP_COMMIT, args.cloud or "aws", args.region
    march = CPU_ARCH[args.family] if args.family else ""
    if args.stack:
        from infra.stack.config import ConfigError  # noqa: PLC0415
        from infra.stack.files import StackFileError, stack_config  # noqa: PLC0415

        try:
            config = stack_config(args.stack)
        except (StackFileError, ConfigError) as error:
            raise _Refused(str(error)) from None
        if args.cloud not in (None, config.cloud):
            raise _Refused(f"--cloud {args.cloud}: stack {args.stack} is on {config.cloud}")
        commit, cloud, region = config.llama_cpp_commit, config.cloud, config.region
        march = cpu_arch(config.main_instance_type, config.instance_type)
    if march:  # every family of the catalog is Arm
        target = family_target("aarch64", march)
        spec = Build(commit, patches_digest(commit), target, "aarch64", march)
        return _Asked(cloud, region, spec, cache_dir() / "llama.cpp" / target)
    prefix = build_prefix(cache_dir())  # the local cluster's build, keyed by this CPU
    machine = platform.machine()
    spec = Build(commit, patches_digest(commit), native_target(machine, prefix.name), machine)
    return _Asked(cloud, region, spec, prefix)


def _programs(args: argparse.Namespace, asked: _Asked, work: Path) -> Path:
    """The programs to pack: those given, or the target's build (made once, then cached)."""
    from infra.local.source import SourceError, sdist_tree  # noqa: PLC0415
    from infra.stage import prebuilt  # noqa: PLC0415

    if args.bin:
        return Path(args.bin)
    try:
        source = args.source or sdist_tree()
    except SourceError as error:
        raise _Refused(str(error)) from None
    spec = asked.spec
    print(f"building llama.cpp {spec.commit[:12]} for {spec.target} (once; cached after)",
          file=sys.stderr)  # fmt: skip
    return prebuilt.build(spec, asked.prefix, source, work / f"{spec.target}.log")


def main(argv: Sequence[str] | None = None) -> int:
    command = parser()
    args = command.parse_args(argv)
    if not (args.bucket or args.out):
        command.error("give --bucket (and --region or --stack), or --out")
    if args.prefix and not args.prefix.endswith("/"):
        command.error(f"--prefix {args.prefix}: end it with /")
    from infra.local.source import cache_dir  # noqa: PLC0415
    from infra.stage import prebuilt  # noqa: PLC0415
    from infra.stage.staging import credentials_problem, sdk_problem  # noqa: PLC0415

    shown: dict[str, str] = {}
    cloud = args.cloud or "aws"
    try:
        request = asked(args)
        spec, work = request.spec, cache_dir() / "prebuild"
        work.mkdir(parents=True, exist_ok=True)
        programs = _programs(args, request, work)
        if problem := prebuilt.stamp_problem(programs, spec):
            raise StageError(problem)
        for line in prebuilt.check_runs(programs, spec.machine):
            print(f"runs: {line}", file=sys.stderr)
        out = Path(args.out or work) / f"{spec.target}.tar.zst"
        shown = {"target": spec.target, "sha256": prebuilt.pack(programs, out), "file": str(out)}
        if args.bucket:
            cloud = request.cloud
            if request.region is None:
                raise _Refused("give --region (or --stack) with --bucket")
            region = request.region
            store = LIVE[cloud].open_store(args.bucket, region=region, endpoint=args.endpoint)
            store.check_region(region)
            shown["url"], shown["sha256"] = prebuilt.upload(store, out, spec, args.prefix)
            # What a stack gives its nodes (LLAMA_PREBUILT): the bundles' common prefix.
            shown["store"] = store.url(args.prefix).rstrip("/")
    except _Refused as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except StageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except LiveError as error:  # no login, no CLI: a setting of this machine's
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the SDK's: credentials, access, a missing bucket
        problem = sdk_problem(LIVE[cloud], args.bucket or "", error)
        if problem is None:
            raise
        print(f"error: {problem}", file=sys.stderr)
        return 2 if credentials_problem(error) else 1
    if args.json:
        print_json(shown)
        return 0
    for name, value in shown.items():
        print(f"{name}: {value}")
    return 0

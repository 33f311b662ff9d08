"""``lrc k8s render``: a stack's cluster as Kubernetes objects (a LeaderWorkerSet, the leaders'
Service, NetworkPolicies, ConfigMaps) and the image's build context, from the stack's settings,
for any Kubernetes cluster (``infra.stack.kube`` makes them; the EKS stack applies the same).

The objects name the image by digest: without ``--image`` the command writes the build context
alone, and says how to build, push and render again with the pushed image's digest."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from infra.boot.node import API_KEY_CREDENTIAL
from infra.cli.options import IN_STACKS, command_parser, print_json, stack_options
from infra.stack.kube import image, objects


def parser() -> argparse.ArgumentParser:
    p = command_parser("k8s", __doc__.splitlines()[0])
    commands = p.add_subparsers(dest="command", required=True)
    render = commands.add_parser(
        "render",
        help="write the stack's Kubernetes objects",
        parents=[stack_options(f"{IN_STACKS} (aws-c8g, ...)")],
    )
    render.add_argument(
        "--image",
        help="the image the pods run, by digest (REF@sha256:...), built from --out's image/; "
        "without it, only the build context is written",
    )  # fmt: skip
    render.add_argument("--name", default="llama-rpc", help="the LeaderWorkerSet's name")
    render.add_argument(
        "--storage-class",
        help="keep each pod's data (the model, a worker's cache) on a claim of this "
        "StorageClass, across restarts of its group; without it, on the node's own storage",
    )
    render.add_argument("--namespace", default="default", help="the namespace of every object")
    render.add_argument(
        "--out", type=Path,
        help="write objects.yaml and the image's build context (image/) here; "
        "without it, the objects go to standard output",
    )  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from infra.stack.config import ConfigError  # noqa: PLC0415
    from infra.stack.files import StackFileError, stack_config  # noqa: PLC0415

    try:
        if args.image is None and args.out is None:
            raise objects.RenderError(
                "--image", "is required without --out (which writes the build context alone)"
            )
        image_ref = args.image or objects.UNBUILT_IMAGE
        objects.check_names(
            name=args.name, namespace=args.namespace, image=image_ref,
            storage_class=args.storage_class,
        )  # fmt: skip
        config = stack_config(args.stack)
        rendered = objects.render(
            config, name=args.name, namespace=args.namespace, image=image_ref,
            storage_class=args.storage_class,
        )  # fmt: skip
    except (objects.RenderError, StackFileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    main_boot, *workers = config.boots(0)
    arch = image.cpu_arch(config.main_instance_type, config.instance_type)
    secret = f"{args.name}-api-key" if main_boot.api_key_file else None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        if args.image is not None:
            (args.out / "objects.yaml").write_text(yaml.safe_dump_all(rendered, sort_keys=False))
        image.write_context(args.out, main_boot, workers[0] if workers else None, arch)
    if args.image is None:
        context = args.out / "image"
        print(
            f"wrote {context}/ (the image's build context, for -march={arch}). Build and push it, "
            "then render the objects with the pushed digest:\n"
            f"  docker buildx build --platform linux/arm64 --build-arg "
            f"{image.BASE_DIGEST_ARG}=sha256:... (the Digest line of `docker buildx imagetools "
            f"inspect {image.BASE_IMAGE}`) "
            f"-t REGISTRY/llama-rpc:TAG --push --metadata-file meta.json {context}\n"
            f"  lrc k8s render --stack {args.stack} --out {args.out} "
            "--image REGISTRY/llama-rpc:TAG@$(jq -r '.\"containerimage.digest\"' meta.json)"
        )
        return 0
    if args.json:
        print_json(
            {
                "stack": args.stack,
                "objects": rendered,
                "out": str(args.out) if args.out else None,
                "apiKeySecret": secret,
            }
        )
        return 0
    if args.out is None:
        sys.stdout.write(yaml.safe_dump_all(rendered, sort_keys=False))
        return 0
    print(f"wrote {args.out / 'objects.yaml'} and {args.out / 'image'}/ (docker build it)")
    if secret:
        # From a file the operator keeps: never on a command line other local users can read.
        print(
            f"the leaders read the API key from Secret {secret}: (umask 077; openssl rand -hex "
            f"24 >api-key) && kubectl create secret generic {secret} -n {args.namespace} "
            f"--from-file={API_KEY_CREDENTIAL}=api-key"
        )
    return 0

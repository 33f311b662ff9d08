"""``lrc k8s render``: a stack's cluster as Kubernetes objects (a LeaderWorkerSet, the leaders'
Service, NetworkPolicies, ConfigMaps) and the image's build context, from the stack's settings,
for any Kubernetes cluster (``infra.stack.kube`` makes them; the EKS stack applies the same)."""

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
        "--image", required=True,
        help="the image the pods run, as your registry names it (built from --out's image/)",
    )  # fmt: skip
    render.add_argument("--name", default="llama-rpc", help="the LeaderWorkerSet's name")
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
        objects.check_names(name=args.name, namespace=args.namespace, image=args.image)
        config = stack_config(args.stack)
        rendered = objects.render(
            config, name=args.name, namespace=args.namespace, image=args.image
        )
    except (objects.RenderError, StackFileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    main_boot, *workers = config.boots(0)
    secret = f"{args.name}-api-key" if main_boot.api_key_file else None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "objects.yaml").write_text(yaml.safe_dump_all(rendered, sort_keys=False))
        image.write_context(args.out, main_boot, workers[0] if workers else None)
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
        print(
            f"the leaders read the API key from Secret {secret}: kubectl create "
            f"secret generic {secret} -n {args.namespace} "
            f'--from-literal={API_KEY_CREDENTIAL}="$(openssl rand -hex 24)"'
        )
    return 0

"""``lrc k8s render``: a stack's cluster as Kubernetes objects (a LeaderWorkerSet, the leaders'
Service, NetworkPolicies, ConfigMaps) and the image's build context, from the stack's settings."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from infra.boot.node import API_KEY_CREDENTIAL
from infra.cli.naming import prog
from infra.cli.options import add_json, add_stack, print_json, stack_of
from infra.core import image_refs
from infra.stack.kube import image, objects

# A Kubernetes object name the LeaderWorkerSet's pods and Service derive theirs from (RFC 1035
# labels: the pods' DNS names in the headless service), kept short enough for its suffixes.
NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog("infra.k8s"), description=__doc__.splitlines()[0])
    commands = p.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render", help="write the stack's Kubernetes objects")
    add_stack(render, "a stack under stacks/ (aws-c8g, ...)")
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
    add_json(render)
    return p


def write_context(out: Path, files: dict[str, tuple[str, str]], recipe: str) -> None:
    context = out / "image"
    for name, (mode, content) in files.items():
        path = context / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(int(mode, 8))
    (context / "Dockerfile").write_text(recipe)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    stack = stack_of(p, args)
    from infra.stack.config import ConfigError  # noqa: PLC0415
    from infra.stack.files import StackFileError, stack_config  # noqa: PLC0415

    try:
        if not NAME.fullmatch(args.name):
            raise objects.RenderError(
                "--name", f"{args.name!r}: 1-40 lowercase letters, digits and '-', from a letter"
            )
        if not image_refs.is_image_reference(args.image):
            raise objects.RenderError(
                "--image", f"{args.image!r} is not {image_refs.IMAGE_MEANING}"
            )
        if not NAMESPACE.fullmatch(args.namespace):
            raise objects.RenderError(
                "--namespace", f"{args.namespace!r}: lowercase letters, digits and '-'"
            )
        config = stack_config(stack)
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
        files = image.context_files(main_boot, workers[0] if workers else None)
        write_context(args.out, files, image.dockerfile(main_boot))
    if args.json:
        print_json(
            {
                "stack": stack,
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

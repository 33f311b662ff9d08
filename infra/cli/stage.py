"""lrc stage: copy a model's parts once into the cloud's object store, checked, for a stack to read.

    lrc stage --stack aws-c8g --bucket my-models [--prefix llama-405b/]
    lrc stage --stack gcp-c4a --bucket my-models          (Cloud Storage)
    lrc stage --stack azure-cobalt --bucket mymodels/models   (Blob Storage: ACCOUNT/CONTAINER)
    lrc stage --region us-east-1 --bucket my-models --url https://…/model.gguf

Each part streams from its URL into the bucket (in pieces, a few at once), its sha256
computed on the way and kept as the object's metadata; a part already there with the same
sha256 is not copied again, and one a stopped run left half-uploaded is resumed. Reads and
uploads are retried; progress goes to stderr. Prints the `model.urls` and `model.sha256` to put
in the stack.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence

from infra.cli.options import add_cloud, add_stack, command_parser, json_option, print_json
from infra.live import LIVE, LiveError, StageError
from infra.observe.status import Progress, gigabytes
from infra.stage.staging import Held, credentials_problem, sdk_problem, stage, staging
from infra.stage.upload import Copied


class Shown:
    """Each part's progress on stderr: one line redrawn on a terminal, else a line every
    ``every`` seconds and at the end of each part."""

    def __init__(self, *, every: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.every, self.clock = every, clock
        self.redraw = sys.stderr.isatty()
        self.started: dict[str, float] = {}
        self.last = float("-inf")
        self.open = False  # a redrawn line is on the terminal, not yet ended

    def end_line(self) -> None:
        """End a redrawn line, so that what follows starts on its own."""
        if self.open:
            print(file=sys.stderr)
            self.open = False

    def __call__(self, copied: Copied) -> None:
        now = self.clock()
        started = self.started.setdefault(copied.name, now)
        finished = copied.total is not None and copied.done >= copied.total
        if not (self.redraw or finished or now - self.last >= self.every):
            return
        self.last = now
        line = f"{copied.name}: {Progress(copied.done, copied.total).describe()}"
        if now - started >= 1:
            line += f", {(copied.done - copied.resumed) / (now - started) / 1e6:,.0f} MB/s"
        if copied.resumed:
            line += f" ({gigabytes(copied.resumed)} already there)"
        if self.redraw:
            print(f"\r\x1b[K{line}", end="\n" if finished else "", file=sys.stderr, flush=True)
            self.open = not finished
        else:
            print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("stage", __doc__.splitlines()[0], [json_option()])
    which = parser.add_mutually_exclusive_group(required=True)
    add_stack(which, "stage this stack's model, in its cloud and region")
    which.add_argument("--region", help="the region of the stack that will read it")
    add_cloud(parser, LIVE, "with --region: the stack's cloud (default aws)")
    parser.add_argument(
        "--bucket", required=True,
        help="an existing bucket in that region (Blob Storage: ACCOUNT/CONTAINER)",
    )  # fmt: skip
    parser.add_argument("--prefix", default="", help="a key prefix, e.g. llama-405b/")
    parser.add_argument("--url", action="append", default=[], help="a part's URL (repeat)")
    parser.add_argument("--sha256", action="append", default=[], help="a part's sha256 (repeat)")
    parser.add_argument(
        "--endpoint", help="another S3 API, a Cloud Storage emulator, or a Blob endpoint URL"
    )
    args = parser.parse_args(argv)
    from infra.stack.config import ConfigError  # noqa: PLC0415
    from infra.stack.files import StackFileError  # noqa: PLC0415

    try:  # what was asked: a mistake here is a usage error (2)
        asked = staging(stack=args.stack, region=args.region, cloud=args.cloud,
                        bucket=args.bucket, urls=args.url, sums=args.sha256)  # fmt: skip
    except (StageError, StackFileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    cloud = LIVE[asked.cloud]
    held, shown = Held(), Shown()
    try:  # the copy itself: a part that fails its checksum, a bucket elsewhere (1)
        store = cloud.open_store(args.bucket, region=asked.region, endpoint=args.endpoint)
        staged, digests = stage(
            store, asked.urls, asked.sums, prefix=args.prefix, region=asked.region,
            report=shown, held=held,
        )  # fmt: skip
    except StageError as error:
        shown.end_line()
        print(f"error: {error}", file=sys.stderr)
        return 1
    except LiveError as error:  # no login, no CLI: a setting of this machine's (2)
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the SDK's: credentials, access, a missing bucket
        problem = sdk_problem(cloud, args.bucket, error, held)
        if problem is None:
            raise
        shown.end_line()
        print(f"error: {problem}", file=sys.stderr)
        return 2 if credentials_problem(error) else 1
    print("# in the stack's llama-rpc-cluster:model:")
    if args.json:
        print_json({"urls": staged, "sha256": digests})
        return 0
    print(f"urls: {json.dumps(staged)}")
    print(f"sha256: {json.dumps(digests)}")
    return 0

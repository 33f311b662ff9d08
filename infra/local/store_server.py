"""The local cluster's S3 API, run inside the store's namespace (``infra.local.store``): moto's
server for S3 alone, its bucket made before it says it is ready, every request it answers one
JSON line in the request log: the client's address, method, path, Range header, status, the
bytes of the body sent and the seconds it took. moto (the ``local`` extra) is imported here only.

    python -m infra.local.store_server --host IP --port N --bucket B --region R --log F --ready F
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def logged(app: Wsgi, log: Path) -> Wsgi:
    """``app``, each answered request appended to ``log`` once its body is sent."""
    lock = threading.Lock()

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        record: dict[str, Any] = {
            "client": environ.get("REMOTE_ADDR", ""),
            "method": environ.get("REQUEST_METHOD", ""),
            "path": environ.get("PATH_INFO", ""),
            "range": environ.get("HTTP_RANGE"),
        }

        def start(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            record["status"] = int(status.split(maxsplit=1)[0])
            return start_response(status, headers, *rest)

        began = time.monotonic()
        body = app(environ, start)
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            record["bytes"] = sent
            record["seconds"] = round(time.monotonic() - began, 4)
            with lock, log.open("a") as out:
                out.write(json.dumps(record) + "\n")

    return answer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="store_server")
    for name in ("--host", "--bucket", "--region"):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    args = parser.parse_args(argv)

    import boto3  # noqa: PLC0415
    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415 (the local extra)
        DomainDispatcherApplication,
        create_backend_app,
    )
    from werkzeug.serving import make_server  # noqa: PLC0415

    # Every service moto has: a request signed for S3 (path-style, to an IP) is S3's.
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(args.host, args.port, logged(app, args.log), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # moto checks no signature: any key signs. The bucket, then the word that the store is up.
    client = boto3.client(
        "s3", endpoint_url=f"http://{args.host}:{args.port}", region_name=args.region,
        aws_access_key_id="store", aws_secret_access_key="store",  # noqa: S106 (moto's)
    )  # fmt: skip
    client.create_bucket(Bucket=args.bucket)
    args.ready.write_text("ready\n")
    thread.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`lrc stage`'s refusals: each says what is wrong, before anything is copied.
Nothing here reaches a network (the copy itself is tested in test_staged_download.py)."""

from __future__ import annotations

import functools
import time

import pytest
from botocore.exceptions import ClientError

from infra.cli.stage import main
from infra.live import LIVE, Piece
from infra.stage.staging import Held, sdk_problem, stage
from infra.stage.upload import copy_part


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--stack", "nope"], "error: stack 'nope': no stacks/Pulumi.nope.yaml; the stacks are"),
        (["--stack", "gcp-c4a", "--cloud", "aws"], "error: --cloud aws: stack gcp-c4a is on gcp"),
        (["--stack", "azure-cobalt"], "error: --bucket my-models: give ACCOUNT/CONTAINER"),
        (["--region", "us-east-1", "--url", "s3://b/k.gguf"], "--url s3://b/k.gguf: give each"),
        (["--region", "us-east-1"], "error: no model URL: give --url"),
        (
            [
                "--region",
                "us-east-1",
                "--url",
                "https://h/a.gguf",
                "--sha256",
                "1",
                "--sha256",
                "2",
            ],
            "error: 2 --sha256 for 1 --url: give one per part",
        ),
    ],
)
def test_bad_staging_input_is_refused_with_the_reason(capsys, args, says) -> None:
    assert main([*args, "--bucket", "my-models"]) == 2
    assert says in capsys.readouterr().err


def test_missing_aws_credentials_are_named_not_a_traceback(capsys, no_aws_credentials) -> None:
    # The request is refused while it is signed, before anything is sent: a setting (2), and
    # nothing is said to be kept.
    code = main(["--region", "us-east-1", "--bucket", "my-models", "--url", "https://h/a.gguf"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Unable to locate credentials" in err and "check your AWS credentials" in err
    assert "nothing was uploaded" in err and "kept" not in err


def test_missing_google_credentials_are_named_not_a_traceback(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata server is asked
    code = main(["--stack", "gcp-c4a", "--bucket", "my-models"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Cloud Storage said:" in err and "gcloud auth application-default login" in err
    assert "nothing was uploaded" in err and "kept" not in err


AZ_NO_LOGIN = """echo "ERROR: Please run 'az login' to setup account." >&2; exit 1
"""


@pytest.mark.parametrize(
    ("az", "says"),
    [(None, "az is not on PATH: install the Azure CLI"), (AZ_NO_LOGIN, "run `az login`")],
    ids=["no-cli", "no-login"],
)
def test_azure_without_a_login_fails_in_seconds_with_one_line(
    capsys, monkeypatch: pytest.MonkeyPatch, fake_bin, az, says
) -> None:
    """It waited 91 s through every credential type, then printed 65 lines of them."""
    directory, write = fake_bin
    if az is not None:
        write("az", az)
    monkeypatch.setenv("PATH", str(directory))
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_ID"):
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    code = main(["--stack", "azure-cobalt", "--bucket", "mymodels/models"])
    assert time.monotonic() - started < 10
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


class Refusing:
    """A store that holds ``held`` pieces from an earlier run and refuses the next upload as S3
    does."""

    def __init__(self, held: int) -> None:
        self.held = held

    def url(self, key: str) -> str:
        return f"s3://b/{key}"

    def check_region(self, region: str) -> None:
        pass

    def have(self, key: str) -> str | None:
        return None

    def earlier(self, key: str) -> dict[int, Piece]:
        return {n: Piece(1, "0" * 32) for n in range(1, self.held + 1)}

    def put(self, key: str, number: int, data: bytes) -> None:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"}}, "UploadPart")


@pytest.mark.parametrize("earlier", [0, 2])
def test_a_failed_copy_says_pieces_are_kept_only_when_there_are_some(
    earlier: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("infra.stage.upload._Source.piece", lambda self, size: b"x" * 10)
    monkeypatch.setattr(
        "infra.stage.staging.copy_part", functools.partial(copy_part, sleep=lambda _: None)
    )
    held = Held()
    with pytest.raises(ClientError) as raised:
        stage(Refusing(earlier), ["https://h/m.gguf"], [], prefix="", region="r", held=held)
    said = sdk_problem(LIVE["aws"], "b", raised.value, held)
    assert said is not None and "S3 said: An error occurred (AccessDenied)" in said
    if earlier:
        assert said.endswith(
            "the 2 pieces it holds are kept, and the same command resumes from them"
        )
    else:
        assert said.endswith("nothing was uploaded")

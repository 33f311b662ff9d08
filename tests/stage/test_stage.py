"""`lrc stage`'s refusals: each says what is wrong, before anything is copied.
Nothing here reaches a network (the copy itself is tested in test_staged_download.py)."""

from __future__ import annotations

import pytest

from infra.cli.stage import main


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
    # The request is refused while it is signed, before anything is sent.
    code = main(["--region", "us-east-1", "--bucket", "my-models", "--url", "https://h/a.gguf"])
    assert code == 1
    err = capsys.readouterr().err
    assert "Unable to locate credentials" in err and "check your AWS credentials" in err


def test_missing_google_credentials_are_named_not_a_traceback(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata server is asked
    code = main(["--stack", "gcp-c4a", "--bucket", "my-models"])
    assert code == 1
    err = capsys.readouterr().err
    assert "Cloud Storage said:" in err and "gcloud auth application-default login" in err

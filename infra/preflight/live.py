"""The preflight's readers with real credentials: inside the Pulumi program, those of the stack's
provider (its region and AWS profile; Google's and Azure's tokens from the providers' own
``getClientConfig``/``getClientToken``), and on the command line, those of the clouds' CLIs."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from infra.preflight import aws, azure, gcp
from infra.preflight.account import Account
from infra.preflight.api import JsonApi
from infra.preflight.needs import Needs

Reader = Callable[[Needs], Account]


class CredentialsError(RuntimeError):
    """No credentials for the cloud: the message says how to get them."""


def aws_reader(profile: str | None = None) -> Reader:
    def read(needs: Needs) -> Account:
        import boto3  # noqa: PLC0415 (only AWS stacks need it)

        session = boto3.Session(profile_name=profile, region_name=needs.region)
        if session.get_credentials() is None:
            raise CredentialsError(
                "no AWS credentials: set AWS_PROFILE (after `aws sso login`), or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        return aws.read(needs, session.client("ec2"), session.client("service-quotas"))

    return read


def gcp_reader(token: Callable[[], tuple[str, str]]) -> Reader:
    """``token`` gives (access token, project)."""

    def read(needs: Needs) -> Account:
        access, project = token()
        return gcp.read(needs, JsonApi(gcp.BASE, access), project)

    return read


def azure_reader(token: Callable[[], tuple[str, str]]) -> Reader:
    """``token`` gives (access token, subscription id)."""

    def read(needs: Needs) -> Account:
        access, subscription = token()
        return azure.read(needs, JsonApi(azure.BASE, access), subscription)

    return read


def program_reader(cloud: str, settings: Mapping[str, Any]) -> Reader:
    """Inside the Pulumi program: the credentials the stack's provider uses (``settings``: the
    provider's own config, such as ``aws:profile``)."""
    if cloud == "aws":
        profile = settings.get("aws:profile")
        return aws_reader(str(profile) if profile else None)
    if cloud == "gcp":

        def google() -> tuple[str, str]:
            import pulumi_gcp  # noqa: PLC0415

            found = pulumi_gcp.organizations.get_client_config()
            if not found.project:
                raise CredentialsError(
                    "no GCP project: set it with `pulumi config set gcp:project <project>`"
                )
            return found.access_token, found.project

        return gcp_reader(google)

    if cloud != "azure":
        raise CredentialsError(f"no preflight reader for {cloud!r}")

    def microsoft() -> tuple[str, str]:
        import pulumi_azure_native as azure_native  # noqa: PLC0415

        token = azure_native.authorization.get_client_token().token
        return token, azure_native.authorization.get_client_config().subscription_id

    return azure_reader(microsoft)


def _cli(argv: list[str], missing: str) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise CredentialsError(missing) from None
    if result.returncode != 0:
        first = next((line for line in result.stderr.splitlines() if line.strip()), "")
        raise CredentialsError(f"{missing} ({first.strip()[:300]})")
    return result.stdout.strip()


def cli_reader(cloud: str, settings: Mapping[str, Any]) -> Reader:
    """On the command line: the clouds' CLIs (``settings``: the stack file's values)."""
    if cloud == "aws":
        profile = settings.get("aws:profile")
        return aws_reader(str(profile) if profile else None)
    if cloud == "gcp":

        def google() -> tuple[str, str]:
            login = "no gcloud login: install the Google Cloud CLI and run `gcloud auth login`"
            token = _cli(["gcloud", "auth", "print-access-token"], login)
            project = str(settings.get("gcp:project") or "") or _cli(
                ["gcloud", "config", "get-value", "project"],
                "no GCP project: set gcp:project in the stack file",
            )
            return token, project

        return gcp_reader(google)
    if cloud != "azure":
        raise CredentialsError(f"no preflight reader for {cloud!r}")

    def microsoft() -> tuple[str, str]:
        login = "no Azure login: install the Azure CLI and run `az login`"
        found = json.loads(
            _cli(
                [
                    "az",
                    "account",
                    "get-access-token",
                    "--resource",
                    azure.BASE,
                    "--output",
                    "json",
                ],
                login,
            )
        )
        return found["accessToken"], found["subscription"]

    return azure_reader(microsoft)

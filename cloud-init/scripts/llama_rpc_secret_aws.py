"""llama-rpc-secret's AWS reader: SSM parameters with the instance role's credentials."""

import datetime
import hashlib
import hmac
import json
import os
import urllib.parse

SSM_ENDPOINT = os.environ.get("SSM_ENDPOINT")  # another SSM API (a test's own, on loopback)


def read(source, *, fetch, imds):
    """``REGION:NAME``: one GetParameter, signed with SigV4 (no AWS CLI on the node)."""
    region, _, name = source.partition(":")
    if not region or not name:
        raise ValueError(f"aws-ssm:{source} is not aws-ssm:REGION:NAME")
    url = SSM_ENDPOINT or f"https://ssm.{region}.amazonaws.com/"
    body = json.dumps({"Name": name, "WithDecryption": True}).encode()
    headers = signed_headers(
        url, region=region, service="ssm", target="AmazonSSM.GetParameter", body=body,
        credentials=role_credentials(fetch, imds),
    )  # fmt: skip
    return json.loads(fetch(url, headers, method="POST", body=body))["Parameter"]["Value"]


def read_path(source, *, fetch, imds):
    """``REGION:PATH``: every parameter under PATH, as {its name after PATH/: its value}
    (GetParametersByPath, recursive, page by page)."""
    region, _, path = source.partition(":")
    if not region or not path:
        raise ValueError(f"aws-ssm:{source} is not aws-ssm:REGION:PATH")
    url = SSM_ENDPOINT or f"https://ssm.{region}.amazonaws.com/"
    credentials, found, token = role_credentials(fetch, imds), {}, None
    while True:
        asked = {"Path": path, "Recursive": True, **({"NextToken": token} if token else {})}
        body = json.dumps(asked).encode()
        headers = signed_headers(
            url, region=region, service="ssm", target="AmazonSSM.GetParametersByPath",
            body=body, credentials=credentials,
        )  # fmt: skip
        page = json.loads(fetch(url, headers, method="POST", body=body))
        found |= {p["Name"][len(path) + 1 :]: p["Value"] for p in page["Parameters"]}
        token = page.get("NextToken")
        if not token:
            return found


def role_credentials(fetch, imds):
    """The instance role's temporary credentials, through IMDSv2."""
    asked = {"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    token = fetch(f"{imds}/latest/api/token", asked, method="PUT").decode()
    headers = {"X-aws-ec2-metadata-token": token}
    base = f"{imds}/latest/meta-data/iam/security-credentials/"
    role = fetch(base, headers).decode().split()[0]
    return json.loads(fetch(base + role, headers))


def _hmac(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signed_headers(url, *, region, service, target, body, credentials):
    """The headers of a POST to ``url``, signed with AWS Signature Version 4."""
    now = datetime.datetime.now(datetime.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {
        "content-type": "application/x-amz-json-1.1",
        "host": urllib.parse.urlsplit(url).netloc,
        "x-amz-date": stamp,
        "x-amz-target": target,
    }
    if credentials.get("Token"):
        headers["x-amz-security-token"] = credentials["Token"]
    names = ";".join(sorted(headers))
    canonical = "POST\n/\n\n{}\n{}\n{}".format(
        "".join(f"{name}:{headers[name]}\n" for name in sorted(headers)),
        names,
        hashlib.sha256(body).hexdigest(),
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{digest}"
    key = _hmac(("AWS4" + credentials["SecretAccessKey"]).encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials['AccessKeyId']}/{scope}, "
        f"SignedHeaders={names}, Signature={signature}"
    )
    return headers

"""Models staged in Cloud Storage (gs://) and Blob Storage (az://): the URLs each cloud takes and
refuses, the read access a GCP or Azure stack gives its main node (Pulumi mocks), and the rclone
remote fetch-model.sh sets up for each store (run in bash, no network)."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pulumi
import pytest
import yaml

from infra.boot import NodeBoot, cloud_config
from infra.clouds import stores
from infra.core import network_rules
from infra.stack.backends.azure import BLOB_DATA_READER
from infra.stack.backends.gcp import OBJECT_VIEWER, staged_model_conditions
from tests.conftest import SCRIPTS
from tests.pulumi_mocks import (
    NO_KEY,
    STAGED_URLS,
    SUBSCRIPTION,
    RecordingMocks,
    custom_data_text,
    deploy,
    deployment,
    env_of,
    parsed_config,
    principal_of,
    refused,
    stack_config,
    staged_model,
)

P = "llama-rpc-cluster:"
STACK = {"aws": "aws-small", "gcp": "gcp-c4a", "azure": "azure-cobalt"}
GCS_URLS = STAGED_URLS["gcp"]
# The model's parts in one container (the staged variant adds two more containers).
BLOB_URLS = STAGED_URLS["azure"][:2]
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"
AZURE_VM = "azure-native:compute:VirtualMachine"
GCP_VM = "gcp:compute/instance:Instance"


def model_with(cloud: str, urls: list[str]) -> dict[str, Any]:
    """The preset's model setting with these part URLs and no checksums."""
    model = stack_config(STACK[cloud])[f"{P}model"]
    return {f"{P}model": {**model, "urls": urls, "sha256": []}}


def staged(cloud: str, urls: list[str], **settings: Any) -> dict[str, Any]:
    return {**model_with(cloud, urls), **{f"{P}{k}": v for k, v in settings.items()}}


# --- which cloud takes which URL --------------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "overrides"),
    [
        ("gcp", staged("gcp", GCS_URLS)),
        ("azure", staged("azure", BLOB_URLS, modelStoreResourceGroup="models-rg")),
    ],
)
def test_each_cloud_takes_its_own_stores_urls(cloud: str, overrides: dict[str, Any]) -> None:
    config = parsed_config(STACK[cloud], overrides)
    main = config.boots(0)[0]
    assert main.staged and main.model_urls == config.model_urls
    assert "rclone" in cloud_config(main)["packages"]


@pytest.mark.parametrize(
    ("cloud", "url", "store"),
    [
        ("aws", GCS_URLS[0], "s3://"),
        ("azure", GCS_URLS[0], "az://"),
        ("aws", BLOB_URLS[0], "s3://"),
        ("gcp", BLOB_URLS[0], "gs://"),
        ("azure", "s3://my-models/llama/m.gguf", "az://"),
    ],
)
def test_another_clouds_store_is_refused_naming_model_urls(
    cloud: str, url: str, store: str
) -> None:
    overrides = staged(cloud, [url])
    if url.startswith("az://"):
        overrides[f"{P}modelStoreResourceGroup"] = "models-rg"
    says = refused(STACK[cloud], overrides, "model.urls")
    assert f"{url!r}: {cloud} nodes read a staged model from {store} URLs only" in says


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("gs://ab/m.gguf", "is not gs://BUCKET/KEY with a bucket name Cloud Storage allows"),
        ("gs://My-Models/m.gguf", "is not gs://BUCKET/KEY"),
        ("gs://-models/m.gguf", "is not gs://BUCKET/KEY"),
        ("gs://" + "b" * 64 + "/m.gguf", "is not gs://BUCKET/KEY"),
        ("gs://my-models/llama/", "a key that ends in the file name"),
    ],
)
def test_a_bad_gcs_url_is_refused_before_anything_is_created(url: str, says: str) -> None:
    overrides = staged("gcp", [url])
    assert says in refused(STACK["gcp"], overrides, "model.urls")
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError):
        deploy(STACK["gcp"], overrides, mocks=mocks)
    assert mocks.resources == [], "nothing may be created"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("az://MyModels/models/m.gguf", "storage account 'MyModels' is not 3-24 lowercase"),
        ("az://ab/models/m.gguf", "storage account 'ab' is not 3-24"),
        ("az://" + "a" * 25 + "/models/m.gguf", "is not 3-24 lowercase letters and digits"),
        ("az://mymodels.blob.core.windows.net/models/m.gguf", "the account's name, not its host"),
        ("az://mymodels/ab/m.gguf", "container 'ab' is not 3-63 lowercase letters"),
        ("az://mymodels/my--models/m.gguf", "container 'my--models' is not"),
        ("az://mymodels/-models/m.gguf", "container '-models' is not"),
        ("az://mymodels/Models/m.gguf", "container 'Models' is not"),
        ("az://mymodels/" + "c" * 64 + "/m.gguf", "is not 3-63"),
        ("az://mymodels/models/", "is not az://ACCOUNT/CONTAINER/KEY"),
        ("az://mymodels/m.gguf", "is not az://ACCOUNT/CONTAINER/KEY"),
    ],
)
def test_a_bad_blob_url_is_refused_before_anything_is_created(url: str, says: str) -> None:
    overrides = staged("azure", [url], modelStoreResourceGroup="models-rg")
    assert says in refused(STACK["azure"], overrides, "model.urls")
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError):
        deploy(STACK["azure"], overrides, mocks=mocks)
    assert mocks.resources == [], "nothing may be created"


def test_store_urls_parse_into_their_names() -> None:
    assert stores.gcs_object("gs://my_models.v2/a/b.gguf") == ("my_models.v2", "a/b.gguf")
    assert stores.blob_object("az://acct01/my-models/a/b.gguf") == (
        "acct01", "my-models", "a/b.gguf",
    )  # fmt: skip
    assert stores.gcs_object(BLOB_URLS[0]) is None
    assert stores.blob_object(GCS_URLS[0]) is None
    assert stores.s3_object(GCS_URLS[0]) is None
    # An https blob URL is a download like any other (a public or SAS-signed blob), not staged.
    https = "https://mymodels.blob.core.windows.net/models/m.gguf"
    assert network_rules.model_url_problem(https) is None
    assert not NodeBoot(role="main", node_ip="10.0.1.10", model_urls=(https,)).staged


def test_blob_urls_need_the_storage_accounts_resource_group() -> None:
    says = refused(STACK["azure"], staged("azure", BLOB_URLS), "modelStoreResourceGroup")
    assert "is required with az:// model URLs: the resource group of storage account " in says
    assert "'mymodels'" in says and "container 'models'" in says


@pytest.mark.parametrize(
    ("cloud", "urls"),
    [("azure", None), ("gcp", GCS_URLS), ("aws", None)],
)
def test_the_resource_group_is_refused_without_blob_urls(
    cloud: str, urls: list[str] | None
) -> None:
    overrides = staged(cloud, urls) if urls else {}
    overrides[f"{P}modelStoreResourceGroup"] = "models-rg"
    says = refused(STACK[cloud], overrides, "modelStoreResourceGroup")
    assert "only az:// model URLs (Azure) use it" in says


@pytest.mark.parametrize("group", ["models.", "my models", "a" * 91, "models/rg"])
def test_a_bad_resource_group_name_is_refused(group: str) -> None:
    overrides = staged("azure", BLOB_URLS, modelStoreResourceGroup=group)
    says = refused(STACK["azure"], overrides, "modelStoreResourceGroup")
    assert "is not an Azure resource group name" in says


# --- GCP: the main node's service account reads exactly the model's objects --------------------


def test_gcp_reads_a_staged_model_with_the_main_nodes_account_over_private_access() -> None:
    assert GCS_URLS == [
        "gs://my-models/llama/part-00001-of-00002.gguf",
        "gs://my-models/llama/part-00002-of-00002.gguf",
    ]
    d = deployment(STACK["gcp"], **staged_model("gcp"))
    [subnet] = d.of_type("gcp:compute/subnetwork:Subnetwork")
    assert subnet.inputs["privateIpGoogleAccess"] is True
    [account] = d.of_type("gcp:serviceaccount/account:Account")
    email = f"{account.inputs['accountId']}@my-project.iam.gserviceaccount.com"
    members = d.of_type(BUCKET_MEMBER)
    assert [m.name for m in members] == [
        "llama-rpc-cluster-main-model-read-0", "llama-rpc-cluster-main-model-read-1",
    ]  # fmt: skip
    for member in members:
        assert member.inputs["bucket"] == "my-models"
        assert member.inputs["role"] == OBJECT_VIEWER == "roles/storage.objectViewer"
        assert member.inputs["member"] == f"serviceAccount:{email}"
    read, listing = (m.inputs["condition"]["expression"] for m in members)
    assert read == (
        'resource.name == "projects/_/buckets/my-models/objects/llama/part-00001-of-00002.gguf"'
        " || "
        'resource.name == "projects/_/buckets/my-models/objects/llama/part-00002-of-00002.gguf"'
    )
    prefix = 'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'
    assert listing == (
        'resource.name == "projects/_/buckets/my-models" && ('
        f'{prefix} == "llama/" || '
        f'{prefix} == "llama/part-00001-of-00002.gguf/" || '
        f'{prefix} == "llama/part-00002-of-00002.gguf/")'
    )
    vms = {vm.name: vm.inputs for vm in d.of_type(GCP_VM)}
    main = vms.pop("llama-rpc-cluster-main")
    assert main["serviceAccount"] == {"email": email, "scopes": ["cloud-platform"]}
    assert all("serviceAccount" not in worker for worker in vms.values())
    env = env_of(main["metadata"]["user-data"])
    assert env["MODEL_URLS"] == " ".join(GCS_URLS) and env["MODEL_SHA256"] == ""
    assert "rclone" in yaml.safe_load(main["metadata"]["user-data"])["packages"]


def test_gcs_conditions_stay_within_iams_limits_and_name_only_the_objects() -> None:
    objects = [("b1", f"m/part-{i:05d}.gguf") for i in range(1, 15)] + [("b2", "top.gguf")]
    conditions = staged_model_conditions(objects)
    for _, title, expression in conditions:
        assert len(re.findall(r"\|\||&&", expression)) <= 12, expression  # IAM's limit
        assert len(title) <= 100
    read = [e for b, t, e in conditions if b == "b1" and t.startswith("read")]
    named = re.findall(r'objects/([^"]+)"', " ".join(read))
    assert named == [key for _, key in objects[:14]]  # each once, in order, and no other
    [top] = [e for b, t, e in conditions if b == "b2" and t.startswith("list")]
    # A part at the bucket's top: its listing is the top level, on that bucket only.
    assert top.startswith('resource.name == "projects/_/buckets/b2" && (')
    assert '== "" ||' in top and '== "top.gguf/")' in top


# --- Azure: the main node's identity reads the model's containers ----------------------------


def test_azure_reads_a_staged_model_with_the_main_nodes_identity_over_a_service_endpoint() -> None:
    urls = STAGED_URLS["azure"]
    assert urls == [*BLOB_URLS, "az://mymodels/other/extra.gguf", "az://mymodels/top/p.gguf"]
    d = deployment(STACK["azure"], **staged_model("azure"))
    [subnet] = d.of_type("azure-native:network:Subnet")
    assert subnet.inputs["serviceEndpoints"] == [{"service": "Microsoft.Storage"}]
    vms = {vm.name: vm.inputs for vm in d.of_type(AZURE_VM)}
    main = vms.pop("llama-rpc-cluster-main")
    assert main["identity"] == {"type": "SystemAssigned"}
    assert all("identity" not in worker for worker in vms.values())
    assignments = [a for a in d.of_type(ROLE_ASSIGNMENT) if a.inputs.get("condition")]
    account = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/models-rg/providers/Microsoft.Storage/"
        "storageAccounts/mymodels"
    )
    assert [a.inputs["scope"] for a in assignments] == [
        f"{account}/blobServices/default/containers/{container}"
        for container in ("models", "other", "top")
    ]
    for assignment in assignments:
        assert assignment.inputs["roleDefinitionId"] == (
            f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/"
            f"{BLOB_DATA_READER}"
        )
        # Storage Blob Data Reader's id, the same in every subscription.
        assert BLOB_DATA_READER == "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
        assert assignment.inputs["principalId"] == principal_of("llama-rpc-cluster-main")
        assert assignment.inputs["principalType"] == "ServicePrincipal"
    env = env_of(custom_data_text(main["osProfile"]["customData"]))
    assert env["MODEL_URLS"] == " ".join(urls)
    assert "MODEL_STORE_ENDPOINT" not in env


# --- https models: nothing changes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "added"), [("gcp", {BUCKET_MEMBER}), ("azure", {ROLE_ASSIGNMENT})]
)
def test_an_https_model_gets_none_of_it(cloud: str, added: set[str]) -> None:
    # No key: the key's reader is an identity too, on Azure.
    plain = deployment(STACK[cloud], **NO_KEY)
    with_store = deployment(STACK[cloud], **staged_model(cloud), **NO_KEY)
    plain_names = {r.name for r in plain.resources}
    extra = {r.name: r.typ for r in with_store.resources if r.name not in plain_names}
    assert extra and set(extra.values()) == added
    assert not [r for r in plain.resources if r.typ in added]
    by_key = {(r.typ, r.name): r.inputs for r in with_store.resources}
    for resource in plain.resources:  # the same inputs, but the main node's and the subnet's
        inputs = dict(by_key[resource.typ, resource.name])
        if resource.typ in ("gcp:compute/subnetwork:Subnetwork", "azure-native:network:Subnet"):
            assert "serviceEndpoints" not in resource.inputs
            inputs.pop("serviceEndpoints", None)
        if resource.name == "llama-rpc-cluster-main":
            assert "identity" not in resource.inputs or cloud == "gcp"
            continue
        assert resource.inputs == inputs, resource.name
    main = plain.named("llama-rpc-cluster-main").inputs
    text = (
        main["metadata"]["user-data"]
        if cloud == "gcp"
        else custom_data_text(main["osProfile"]["customData"])
    )
    assert "rclone" not in yaml.safe_load(text)["packages"]
    assert "MODEL_STORE_REGION" not in env_of(text)


# --- fetch-model.sh: the rclone remote for each store ----------------------------------------


def store_remote(url: str, **env: str) -> tuple[int, str, dict[str, str]]:
    """Runs store_remote (store-remote.sh, which fetch-staged.sh sources for fetch-model.sh) in
    a clean bash: its status, store_path and the RCLONE_CONFIG_STORE_* variables it exported."""
    text = (SCRIPTS / "store-remote.sh").read_text()
    match = re.search(r"^store_remote\(\) \{\n.*?^\}\n", text, re.DOTALL | re.MULTILINE)
    assert match, "store-remote.sh defines store_remote"
    script = (
        match.group(0)
        + 'store_remote "$1"; code=$?; printf "%s\\n" "$code" "${store_path:-}"; '
        + "env | grep '^RCLONE_' | sort"
    )
    result = subprocess.run(
        ["bash", "-c", script, "bash", url], env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    code, path, *exported = result.stdout.splitlines()
    return int(code), path, dict(line.split("=", 1) for line in exported)


def test_fetch_model_points_rclone_at_s3_as_before() -> None:
    code, path, env = store_remote("s3://models/llama/m.gguf", MODEL_STORE_REGION="eu-west-1")
    assert (code, path) == (0, "store:models/llama/m.gguf")
    assert env == {
        "RCLONE_CONFIG_STORE_TYPE": "s3",
        "RCLONE_CONFIG_STORE_ENV_AUTH": "true",
        "RCLONE_CONFIG_STORE_REGION": "eu-west-1",
        "RCLONE_CONFIG_STORE_PROVIDER": "AWS",
    }
    _, _, other = store_remote(
        "s3://models/m.gguf", MODEL_STORE_REGION="us-east-1", MODEL_STORE_ENDPOINT="http://s3.test"
    )
    assert other["RCLONE_CONFIG_STORE_PROVIDER"] == "Other"
    assert other["RCLONE_CONFIG_STORE_ENDPOINT"] == "http://s3.test"


def test_fetch_model_reads_cloud_storage_with_the_vms_service_account() -> None:
    code, path, env = store_remote(GCS_URLS[0], MODEL_STORE_REGION="us-central1")
    assert (code, path) == (0, "store:my-models/llama/part-00001-of-00002.gguf")
    assert env == {
        "RCLONE_CONFIG_STORE_TYPE": "google cloud storage",
        "RCLONE_CONFIG_STORE_ENV_AUTH": "true",
    }


def test_fetch_model_reads_blob_storage_with_the_vms_managed_identity() -> None:
    code, path, env = store_remote(BLOB_URLS[1], MODEL_STORE_REGION="eastus")
    assert (code, path) == (0, "store:models/llama/part-00002-of-00002.gguf")
    assert env == {
        "RCLONE_CONFIG_STORE_TYPE": "azureblob",
        "RCLONE_CONFIG_STORE_USE_MSI": "true",
        "RCLONE_CONFIG_STORE_ACCOUNT": "mymodels",
    }


def test_fetch_model_has_no_remote_for_other_urls() -> None:
    code, path, env = store_remote("https://example.com/m.gguf")
    assert (code, path, env) == (1, "", {})


def test_the_staged_download_is_the_boots_for_every_store_scheme() -> None:
    """fetch-model.sh sources the staged download for every scheme the node calls staged, and
    hands each such part to rclone."""
    from infra.boot.node import STAGED_SCHEMES

    text = (SCRIPTS / "fetch-model.sh").read_text()
    staged = (SCRIPTS / "store-remote.sh").read_text()
    sourced = re.search(r"\(([a-z0-9|]+)\):// \]\]; then\n\s*source [^\n]*fetch-staged\.sh", text)
    assert sourced, "fetch-model.sh sources fetch-staged.sh for staged URLs"
    assert {f"{s}://" for s in sourced.group(1).split("|")} == set(STAGED_SCHEMES)
    for scheme in STAGED_SCHEMES:
        assert f'"$url" == {scheme}*' in text, scheme
        assert f"  {scheme}*)" in staged, scheme
    assert set(STAGED_SCHEMES) == set(stores.STORE_SCHEMES)
    assert json.dumps(sorted(STAGED_SCHEMES)) == '["az://", "gs://", "s3://"]'


def test_azure_reads_only_the_staged_blobs_and_lists_only_where_they_are() -> None:
    """Storage Blob Data Reader on a container reads every blob in it; the condition narrows it
    to the model's parts, as the AWS and GCP grants are."""
    d = deployment(STACK["azure"], **staged_model("azure"))
    conditions = {
        a.inputs["scope"].rsplit("/", 1)[1]: a.inputs
        for a in d.of_type(ROLE_ASSIGNMENT)
        if a.inputs.get("condition")  # the model's readers (the key's has none)
    }
    assert {c["conditionVersion"] for c in conditions.values()} == {"2.0"}
    models = conditions["models"]["condition"]
    read = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read"
    path = "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path]"
    prefix = "@Request[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:prefix]"
    parts = [url.split("/", 4)[4] for url in BLOB_URLS]
    assert models == (
        f"((!(ActionMatches{{'{read}'}} AND NOT SubOperationMatches{{'Blob.List'}})) OR "
        f"({path} ForAnyOfAnyValues:StringEquals {{'{parts[0]}', '{parts[1]}'}})) AND "
        f"((!(ActionMatches{{'{read}'}} AND SubOperationMatches{{'Blob.List'}})) OR "
        f"({prefix} ForAnyOfAnyValues:StringEquals "
        f"{{'llama/', '{parts[0]}/', '{parts[1]}/'}}))"
    )
    # Each container's condition names its own blobs only.
    assert "extra.gguf" in conditions["other"]["condition"]
    assert "extra.gguf" not in models and "p.gguf" not in models
    # A part at a container's top is listed without a prefix, which no condition names.
    top = conditions["top"]["condition"]
    assert f"{path} ForAnyOfAnyValues:StringEquals {{'p.gguf'}}" in top
    assert top.count("Blob.List") == 1 and prefix not in top

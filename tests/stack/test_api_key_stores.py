"""The API key on Google Cloud and Azure, under mocks: generated per stack, kept in the cloud's
secret store (a Secret Manager secret; a secret of the stack's own Key Vault), readable by the
main nodes' identity alone and that secret alone, named to the main node (never given), and an
output that is a secret. AWS's is in tests/stack/test_aws.py."""

from __future__ import annotations

from typing import Any

import pytest

from infra.clouds.azure import KEY_VAULT_TAG
from infra.conformance import rules
from infra.core import outputs
from infra.stack.backends.azure import KEY_VAULT_SECRETS_USER
from infra.stack.backends.gcp import KEY_READER_ROLE
from infra.stack.config import AZURE_API_KEY_SECRET
from tests.pulumi_mocks import (
    GENERATED_KEY,
    GIVEN_KEY,
    NO_KEY,
    REPLICAS,
    SUBSCRIPTION,
    Deployment,
    custom_data_text,
    deployment,
    env_of,
    is_secret_input,
    principal_of,
    revealed,
)

GCP_VM = "gcp:compute/instance:Instance"
AZURE_VM = "azure-native:compute:VirtualMachine"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"


def boot_env(d: Deployment, cloud: str, vm: Any) -> tuple[str, dict[str, str]]:
    """A VM's boot data, and its node settings (none on the balancer node)."""
    text = (
        str(vm.inputs["metadata"]["user-data"])
        if cloud == "gcp"
        else custom_data_text(vm.inputs["osProfile"]["customData"])
    )
    return text, {} if vm.name.endswith("-balancer") else env_of(text)


def assert_told_where_not_what(d: Deployment, cloud: str, key: str, source: str) -> None:
    vms = d.of_type(GCP_VM if cloud == "gcp" else AZURE_VM)
    mains = [vm for vm in vms if vm.name.endswith("main")]
    assert len(mains) == 2  # two serving groups: every main node reads it
    for vm in vms:
        text, env = boot_env(d, cloud, vm)
        assert key not in text
        if vm in mains:
            assert env["API_KEY_SOURCE"] == source
            assert env["API_KEY_FILE"] == "/run/credstore/llama-rpc-api-key"
        else:
            assert "API_KEY_SOURCE" not in env and "API_KEY_FILE" not in env
    assert d.outputs[outputs.API_KEY] == key
    assert outputs.API_KEY in d.secret_outputs


def generated(d: Deployment) -> str:
    [password] = d.of_type("random:index/randomPassword:RandomPassword")
    key = str(d.states[password.typ, password.name][1]["result"])
    assert len(key) == 48 and key.startswith(GENERATED_KEY[:10])
    return key


def test_gcp_keeps_the_key_in_secret_manager_for_the_main_nodes_account_alone() -> None:
    d = deployment("gcp-c4a", **REPLICAS)
    key = generated(d)
    [secret] = d.of_type("gcp:secretmanager/secret:Secret")
    assert secret.inputs["secretId"] == "llama-rpc-cluster-gcp-c4a-api-key"
    assert secret.inputs["replication"] == {"auto": {}}
    [api] = d.of_type("gcp:projects/service:Service")  # the project's API, on first
    assert api.inputs["service"] == "secretmanager.googleapis.com"
    assert api.inputs["disableOnDestroy"] is False  # another stack may use it
    waits = d.options_of(secret).depends_on or []
    assert [w.pulumi_resource_name for w in waits] == [api.name]
    [version] = d.of_type("gcp:secretmanager/secretVersion:SecretVersion")
    assert (
        is_secret_input(version.inputs["secretData"])
        and revealed(version.inputs["secretData"]) == key
    )
    assert version.inputs["secret"] == d.states[secret.typ, secret.name][0]
    [grant] = d.of_type("gcp:secretmanager/secretIamMember:SecretIamMember")
    assert grant.inputs["role"] == KEY_READER_ROLE == "roles/secretmanager.secretAccessor"
    assert grant.inputs["secretId"] == d.states[secret.typ, secret.name][0]  # that secret alone
    [account] = d.of_type("gcp:serviceaccount/account:Account")
    email = d.states[account.typ, account.name][1]["email"]
    assert grant.inputs["member"] == f"serviceAccount:{email}"
    for vm in d.of_type(GCP_VM):  # the account is the main nodes' alone
        has = (vm.inputs.get("serviceAccount") or {}).get("email")
        assert (has == email) == vm.name.endswith("main")
    assert_told_where_not_what(d, "gcp", key, "gcp-sm:llama-rpc-cluster-gcp-c4a-api-key")


def test_azure_keeps_the_key_in_the_stacks_vault_for_each_main_nodes_identity_alone() -> None:
    d = deployment("azure-cobalt", **REPLICAS)
    key = generated(d)
    [vault] = d.of_type("azure-native:keyvault:Vault")
    properties = vault.inputs["properties"]
    assert properties["enableRbacAuthorization"] is True
    assert properties["tenantId"] == "t"
    [nat_ip] = d.of_type("azure-native:network:PublicIPAddress")
    acl = properties["networkAcls"]
    assert (acl["defaultAction"], acl["bypass"]) == ("Deny", "None")
    assert [rule["value"] for rule in acl["ipRules"]] == [
        d.states[nat_ip.typ, nat_ip.name][1].get("ipAddress", "")
    ]
    vault_name = vault.inputs["vaultName"]
    assert vault_name.startswith("lrc") and len(vault_name) == 19
    [secret] = d.of_type("azure-native:keyvault:Secret")
    assert secret.inputs["secretName"] == AZURE_API_KEY_SECRET
    assert secret.inputs["vaultName"] == vault_name
    assert is_secret_input(secret.inputs["properties"])  # encrypted in the state as well
    assert revealed(secret.inputs["properties"])["value"] == key
    readers = {
        a.inputs["principalId"]: a.inputs
        for a in d.of_type(ROLE_ASSIGNMENT)
        if a.inputs["roleDefinitionId"].endswith(KEY_VAULT_SECRETS_USER)
    }
    mains = [vm for vm in d.of_type(AZURE_VM) if vm.name.endswith("main")]
    assert set(readers) == {principal_of(vm.name) for vm in mains}  # the main nodes alone
    for vm in mains:
        granted = readers[principal_of(vm.name)]
        # That secret, by its own id: the grant waits for it (Azure refuses an assignment at a
        # scope that does not exist yet).
        secret_id = d.states[secret.typ, secret.name][0]
        assert granted["scope"] == secret_id and secret_id.endswith(
            f"/secrets/{AZURE_API_KEY_SECRET}"
        )
        assert granted["roleDefinitionId"] == (
            f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/"
            f"{KEY_VAULT_SECRETS_USER}"
        )
        assert vm.inputs["identity"] == {"type": "SystemAssigned"}
        assert vm.inputs["tags"][KEY_VAULT_TAG] == vault_name  # where the node finds its vault
    stack = d.stack()
    secret_key = rules.key_of(secret.typ, secret.name)
    grants = [r for r in stack.resources if r.name.endswith("-api-key-read")]
    assert grants and all(secret_key in grant.depends_on for grant in grants)
    for vm in d.of_type(AZURE_VM):
        if vm not in mains:
            assert "identity" not in vm.inputs and KEY_VAULT_TAG not in vm.inputs["tags"]
    assert_told_where_not_what(d, "azure", key, f"azure-kv:{AZURE_API_KEY_SECRET}")


@pytest.mark.parametrize(
    ("stack", "kinds"),
    [
        ("gcp-c4a", ["gcp:secretmanager/secret:Secret"]),
        ("azure-cobalt", ["azure-native:keyvault:Vault", "azure-native:keyvault:Secret"]),
    ],
)
def test_a_given_key_is_kept_and_none_keeps_none(stack: str, kinds: list[str]) -> None:
    given = deployment(stack, **GIVEN_KEY)
    assert not given.of_type("random:index/randomPassword:RandomPassword")
    assert given.outputs[outputs.API_KEY] == GIVEN_KEY["apiKey"] == "a-team-key-of-our-own-1234"
    none = deployment(stack, **NO_KEY)
    assert none.outputs[outputs.API_KEY] is None
    assert not [r for r in none.resources if r.typ in kinds]
    cloud = "gcp" if stack.startswith("gcp") else "azure"
    main = none.named("llama-rpc-cluster-main")
    assert "API_KEY_SOURCE" not in boot_env(none, cloud, main)[1]

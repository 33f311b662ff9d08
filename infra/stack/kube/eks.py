"""``LlamaRpcKubernetesCluster``: the stack on EKS (``platform: kubernetes``).

The VPC of the VM stacks (its NAT, baseline and flow logs), an EKS control plane whose endpoint
is private (public only for ``kubernetesApiCidrs``), the VPC CNI enforcing network policies in
strict mode (a new pod is denied everything until its policies apply) with a role of its own that
EKS Pod Identity gives its service account alone (the nodes' role holds no network-interface
rights), and one managed node group of Graviton nodes per instance type (Amazon Linux 2023 for
Arm, IMDSv2 only, encrypted gp3 disks, one cluster placement group, no SSH). On it: the
LeaderWorkerSet controller from its release, and the objects ``lrc k8s render`` writes for the
same stack (``infra.stack.kube.objects``), with the stack's API key as a Secret, and the policies
strict mode needs for the cluster's DNS and the controller (``infra.stack.kube.system``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.boot.node import API_KEY_CREDENTIAL
from infra.clouds import aws as aws_facts
from infra.core import layout, network_rules, outputs, scheduling
from infra.stack.backends.aws import EC2_ASSUME_ROLE, AwsBackend
from infra.stack.component import stack_api_key
from infra.stack.config import ClusterConfig
from infra.stack.kube import controller as lws_controller
from infra.stack.kube import objects, system

# The Kubernetes names of the stack's objects: one namespace, the LeaderWorkerSet's name.
NAMESPACE = layout.PROJECT
LWS_NAME = "llama-rpc"
ROLE_LABEL = "llama-rpc-cluster/node-role"
KUBERNETES_API_PORT = 443  # the EKS endpoint's
# The namespace admits only pods of the "restricted" Pod Security profile, which every pod the
# stack renders passes (https://kubernetes.io/docs/concepts/security/pod-security-admission/).
POD_SECURITY = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
# A role EKS Pod Identity hands to a service account's pods (the EKS guide's trust policy: both
# actions, the pods.eks.amazonaws.com principal).
POD_IDENTITY_ASSUME_ROLE = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": aws_facts.EKS_POD_IDENTITY_PRINCIPAL},
            "Action": ["sts:AssumeRole", "sts:TagSession"],
        }
    ],
}
# Labels of the objects the stack puts in the cluster's own namespaces.
SYSTEM_LABELS = {"app.kubernetes.io/part-of": layout.PROJECT}
ROOT_DEVICE = "/dev/xvda"  # Amazon Linux 2023's root volume, which holds the pods' model
EKS_ASSUME_ROLE = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "eks.amazonaws.com"},
            "Action": ["sts:AssumeRole", "sts:TagSession"],
        }
    ],
}


@dataclass(frozen=True)
class NodePool:
    """One managed node group: the nodes of one instance type, every group's."""

    role: str  # "main", "worker", or "nodes" when both roles share the type
    instance_type: str
    count: int
    disk_gb: int
    disk_throughput_mibps: int | None


def node_pools(config: ClusterConfig) -> list[NodePool]:
    """The node groups the pods' node selectors (by instance type) need: every group's main
    node and workers (``ClusterConfig.kubernetes_worker_disk``: where they share a type)."""
    main, worker = config.main_instance_type.name, config.instance_type.name
    mains = NodePool(
        "main", main, config.replicas, config.main_disk_gb, config.disk_throughput_mibps
    )
    if not config.worker_count:
        return [mains]
    workers = config.replicas * config.worker_count
    disk, throughput = config.kubernetes_worker_disk
    if main == worker:
        return [NodePool("nodes", main, config.replicas + workers, disk, throughput)]
    return [mains, NodePool("worker", worker, workers, disk, throughput)]


def unschedulable(config: ClusterConfig, rendered: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rendered pods that no node of the stack's node groups can hold beside what the
    platform runs on them (``infra.core.scheduling``)."""
    types = {t.name: t for t in (config.main_instance_type, config.instance_type)}
    groups = [
        scheduling.NodeGroup(
            pool.instance_type,
            types[pool.instance_type].vcpus,
            types[pool.instance_type].memory_bytes,
            pool.count,
        )
        for pool in node_pools(config)
    ]
    pods: list[scheduling.Pod] = []
    for obj in rendered:
        if obj["kind"] == "LeaderWorkerSet":
            pods += scheduling.leaderworkerset_pods(obj)
        elif obj["kind"] == "Deployment":
            pods += scheduling.deployment_pods(obj["metadata"]["name"], obj)
    return scheduling.unplaced(pods, groups)


def workloads(config: ClusterConfig) -> list[dict[str, Any]]:
    """The objects the stack applies, refused before anything is created when a setting cannot
    be rendered or a pod would fit no node."""
    try:
        rendered = objects.render(
            config, name=LWS_NAME, namespace=NAMESPACE, image=str(config.kubernetes_image)
        )
    except objects.RenderError as error:
        raise pulumi.RunError(f"{error}; nothing was created") from None
    problems = unschedulable(config, rendered)
    if problems:
        raise pulumi.RunError(
            "the pods would not all fit the stack's node groups, and nothing was created:\n"
            + "\n".join(f"  - {problem}" for problem in problems)
        )
    return rendered


def controller_manifest(config: ClusterConfig) -> str:
    """The LWS controller's manifest as the stack applies it (``infra.stack.kube.controller``):
    refused before anything is created when it cannot be pinned."""
    try:
        pinned = lws_controller.release(
            config.kubernetes_controller_sha256, config.kubernetes_controller_image
        )
        return str(lws_controller.verified_manifest(pinned))
    except lws_controller.ControllerError as error:
        raise pulumi.RunError(str(error)) from None
    except OSError as error:  # the download (URLError is one)
        raise pulumi.RunError(
            f"the LeaderWorkerSet controller's manifest could not be fetched ({error}); "
            "nothing was created"
        ) from None


def api_ranges(cidrs: Sequence[str]) -> tuple[list[str], list[str]]:
    """kubernetesApiCidrs split: the internet's ranges (the public endpoint's allow list) and the
    rest (private networks, which reach the private endpoint)."""
    private = [c for c in cidrs if network_rules.is_internal(c)]
    return [c for c in cidrs if c not in private], private


def kubeconfig(
    cluster: str,
    endpoint: str | None,
    authority: str | None,
    region: str,
    profile: str | None = None,
) -> str:
    """A kubeconfig for the cluster that asks the AWS CLI for a token on each use (a token taken
    once would expire in the 15 minutes an `up` can take before the objects are applied), with
    the AWS provider's profile."""
    token: dict[str, Any] = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "aws",
        "args": ["eks", "get-token", "--region", region, "--cluster-name", cluster],
    }
    if profile:
        token["env"] = [{"name": "AWS_PROFILE", "value": profile}]
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": cluster,
                    "cluster": {"server": endpoint, "certificate-authority-data": authority},
                }
            ],
            "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
            "current-context": cluster,
            "users": [{"name": cluster, "user": {"exec": token}}],
        }
    )


def service_url(config: ClusterConfig) -> str:
    return f"http://{LWS_NAME}-api.{NAMESPACE}.svc.{objects.CLUSTER_DOMAIN}:{config.server_port}"


def group_outputs(config: ClusterConfig, group: int) -> dict[str, Any]:
    """A group's outputs: its leader and workers by their DNS names (pods' addresses change)."""
    hosts = objects.worker_hosts(LWS_NAME, config.worker_count, config.rpc_port)
    leader = objects.leader_names(config, LWS_NAME, NAMESPACE)[group]
    return {
        outputs.MAIN_PRIVATE_IP: None,
        outputs.WORKER_PRIVATE_IPS: [],
        outputs.RPC_SERVERS: hosts.replace(f"$({objects.GROUP_INDEX})", str(group)),
        outputs.LLAMA_SERVER_URL: f"http://{leader}:{config.server_port}",
        outputs.MAIN_INSTANCE_ID: None,
        outputs.WORKER_INSTANCE_IDS: [],
    }


# The typed pulumi-kubernetes class of each kind ``objects.render`` writes.
KINDS: Mapping[str, Any] = {
    "ConfigMap": k8s.core.v1.ConfigMap,
    "Service": k8s.core.v1.Service,
    "NetworkPolicy": k8s.networking.v1.NetworkPolicy,
    "Deployment": k8s.apps.v1.Deployment,
}


@dataclass(frozen=True)
class LlamaRpcKubernetesClusterArgs:
    config: ClusterConfig
    zone: str | None = None  # the nodes' zone (the preflight chooses it)
    # The AWS provider's profile (aws:profile), which kubectl's token and connectCommand use.
    aws_profile: str | None = None


class LlamaRpcKubernetesCluster(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        args: LlamaRpcKubernetesClusterArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # Refused here, before the component or any resource is registered.
        rendered = workloads(args.config)
        manifest = controller_manifest(args.config)
        super().__init__("llama-rpc-cluster:index:LlamaRpcKubernetesCluster", name, None, opts)
        config = args.config
        if args.zone is None:
            raise ValueError("AWS subnets need a zone (the preflight chooses one)")
        self._aws = AwsBackend()
        child = pulumi.ResourceOptions(parent=self)
        other_zone = aws.get_availability_zones_output(
            state="available",
            exclude_names=[args.zone],
            exclude_zone_ids=list(aws_facts.EKS_UNSUPPORTED_ZONE_IDS),
            filters=[{"name": "opt-in-status", "values": ["opt-in-not-required"]}],
            opts=pulumi.InvokeOutputOptions(parent=self),
        ).names[0]
        nat_subnet, plane_subnet = layout.kubernetes_subnets(config.vpc_cidr)
        vpc, subnets, _ = self._aws.vpc_behind_nat(
            name,
            config,
            self,
            public_range=nat_subnet,
            private=[
                ("private", config.private_subnet, args.zone),
                ("control-plane", plane_subnet, other_zone),
            ],
            zone=args.zone,
        )
        _, nodes_subnet, plane = subnets
        network_tags = self._aws.tags(config, "network")
        self._aws.baseline(name=name, vpc=vpc, subnets=subnets, tags=network_tags, opts=child)
        if config.flow_logs:
            self._aws.flow_logs(name, vpc, network_tags, child)

        cluster, addons = self._control_plane(name, config, subnets=[nodes_subnet, plane])
        provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=pulumi.Output.all(
                cluster.name, cluster.endpoint, cluster.certificate_authority.data
            ).apply(
                lambda got: kubeconfig(got[0], got[1], got[2], config.region, args.aws_profile)
            ),
            opts=child,
        )
        # Strict mode denies a pod everything until a policy selects it: the cluster's DNS and
        # the controller get theirs. The Kubernetes API is the `kubernetes` Service's address
        # and the control plane's interfaces in the VPC.
        api = cluster.kubernetes_network_config.apply(
            lambda network: system.kubernetes_service_address(network.service_ipv4_cidr)
        )
        # The DNS's policy needs only the API, and the nodes join after it: CoreDNS never
        # starts without it.
        dns_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-cluster-dns",
            **system.dns_policy(name, SYSTEM_LABELS, vpc_cidr=str(config.vpc_cidr), api=api),
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )
        node_role = self._role(f"{name}-node", EC2_ASSUME_ROLE, aws_facts.EKS_NODE_POLICIES, config)
        placement = aws.ec2.PlacementGroup(
            f"{name}-placement",
            strategy="cluster",
            tags=self._aws.tags(config, "nodes"),
            opts=child,
        )
        pools = [
            self._node_group(
                pool,
                config,
                name=name,
                cluster=cluster,
                role=node_role,
                subnet=nodes_subnet,
                placement=placement,
                network=[*addons, dns_policy],
            )
            for pool in node_pools(config)
        ]
        api_key = stack_api_key(name, config, self)
        self._workloads(
            name,
            config,
            provider,
            api,
            api_key,
            rendered=rendered,
            after=[*addons, *pools],
            manifest=manifest,
        )

        cost = config.hourly_cost
        per_group = [group_outputs(config, group) for group in range(config.replicas)]
        self.outputs: dict[str, Any] = {
            outputs.CLOUD: config.cloud,
            outputs.REGION: config.region,
            outputs.INSTANCE_TYPE: config.instance_type.name,
            outputs.WORKER_COUNT: config.worker_count,
            **per_group[0],
            outputs.CONNECT_COMMAND: cluster.name.apply(
                lambda cluster_name: connect_command(config, cluster_name, args.aws_profile)
            ),
            outputs.API_KEY: api_key,
            outputs.HOURLY_COST_USD: cost.total,
            outputs.STOPPED_HOURLY_COST_USD: cost.stopped,
            outputs.LLAMA_CPP_COMMIT: config.llama_cpp_commit,
            outputs.REPLICAS: config.replicas,
            outputs.BALANCER_URL: service_url(config) if config.balancer_boot else None,
            outputs.GROUPS: per_group,
            outputs.BALANCER_INSTANCE_ID: None,  # HAProxy runs as pods
            outputs.METRICS_DOCUMENT: None,
            outputs.ZONE: nodes_subnet.availability_zone,
            outputs.RESOURCE_GROUP: None,
        }
        self.details: dict[str, Any] = {
            outputs.HOURLY_COST_BASIS: cost.basis,
            outputs.MAIN_INSTANCE_TYPE: config.main_instance_type.name,
            outputs.LIMITATIONS: [f"{k}: {v}" for k, v in limitations(config).items()],
            outputs.PLATFORM: config.platform,
            outputs.KUBERNETES_CLUSTER: cluster.name,
            outputs.KUBERNETES_NAMESPACE: NAMESPACE,
        }
        self.register_outputs({**self.outputs, **self.details})

    def _control_plane(
        self, name: str, config: ClusterConfig, *, subnets: list[aws.ec2.Subnet]
    ) -> tuple[aws.eks.Cluster, list[aws.eks.Addon]]:
        """The EKS control plane in the two subnets, its endpoint as ``kubernetesApiCidrs`` says,
        the Pod Identity agent, and the VPC CNI add-on that enforces network policies in strict
        mode with its own role."""
        child = pulumi.ResourceOptions(parent=self)
        cluster_role, cluster_policies = self._role(
            f"{name}-cluster", EKS_ASSUME_ROLE, aws_facts.EKS_CLUSTER_POLICIES, config
        )
        # kubernetesApiCidrs: a public range reaches the public endpoint, which is on only for
        # them; a private one (a VPN, a peered network) the private endpoint, through the
        # cluster's security group.
        public, private = api_ranges(config.kubernetes_api_cidrs)
        endpoint: aws.eks.ClusterVpcConfigArgsDict = {
            "subnet_ids": [subnet.id for subnet in subnets],
            "endpoint_private_access": True,
            "endpoint_public_access": bool(public),
        }
        if public:
            endpoint["public_access_cidrs"] = public
        cluster = aws.eks.Cluster(
            f"{name}-eks",
            role_arn=cluster_role.arn,
            version=aws_facts.EKS_VERSION,
            vpc_config=endpoint,
            access_config={
                "authentication_mode": "API",
                "bootstrap_cluster_creator_admin_permissions": True,
            },
            upgrade_policy={"support_type": aws_facts.EKS_SUPPORT_TYPE},
            tags=self._aws.tags(config, "control-plane"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster_policies),
        )
        for index, cidr in enumerate(private):
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-kubernetes-api-{index}",
                security_group_id=cluster.vpc_config.cluster_security_group_id,
                ip_protocol="tcp",
                from_port=KUBERNETES_API_PORT,
                to_port=KUBERNETES_API_PORT,
                cidr_ipv4=cidr,
                description="the Kubernetes API from kubernetesApiCidrs",
                tags=self._aws.tags(config, "control-plane"),
                opts=child,
            )
        # The agent runs on each node's host network, so it serves before the CNI does; the CNI
        # asks it for its role's credentials.
        agent = aws.eks.Addon(
            f"{name}-pod-identity-agent",
            cluster_name=cluster.name,
            addon_name=aws_facts.EKS_POD_IDENTITY_AGENT,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=self._aws.tags(config, "control-plane"),
            opts=child,
        )
        cni_role, cni_policies = self._role(
            f"{name}-cni", POD_IDENTITY_ASSUME_ROLE, aws_facts.EKS_CNI_POLICIES, config
        )
        cni = aws.eks.Addon(
            f"{name}-vpc-cni",
            cluster_name=cluster.name,
            addon_name="vpc-cni",
            configuration_values=json.dumps(aws_facts.EKS_VPC_CNI_CONFIGURATION),
            # aws-node, and no other pod, takes the CNI's role.
            pod_identity_associations=[
                {"role_arn": cni_role.arn, "service_account": aws_facts.EKS_CNI_SERVICE_ACCOUNT}
            ],
            # EKS installs its own vpc-cni first; the managed add-on takes it over.
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=self._aws.tags(config, "control-plane"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[agent, *cni_policies]),
        )
        return cluster, [agent, cni]

    def _workloads(
        self,
        name: str,
        config: ClusterConfig,
        provider: k8s.Provider,
        api: pulumi.Output[str],
        api_key: pulumi.Output[str] | None,
        *,
        rendered: list[dict[str, Any]],
        after: list[pulumi.Resource],
        manifest: str,
    ) -> None:
        """On the cluster: the LeaderWorkerSet controller once the nodes and their network are
        up (``after``) and its policy (strict mode), the namespace, the API key's Secret and the
        rendered objects."""
        on_cluster = pulumi.ResourceOptions(parent=self, provider=provider)
        # The controller's own Deployment waits for a node, and the network for its CNI. Its
        # pods cannot become ready before their policy (which needs the manifest's namespace)
        # is in: the manifest is applied without waiting, and a patch of the Deployment waits.
        controller = k8s.yaml.v2.ConfigFile(
            f"{name}-lws-controller",
            file=manifest,
            skip_await=True,
            opts=pulumi.ResourceOptions.merge(
                on_cluster,
                pulumi.ResourceOptions(depends_on=after),
            ),
        )
        controller_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-lws-controller-policy",
            **system.controller_policy(name, SYSTEM_LABELS, vpc_cidr=str(config.vpc_cidr), api=api),
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[controller])
            ),
        )
        ready = k8s.apps.v1.DeploymentPatch(
            f"{name}-lws-controller-ready",
            metadata={
                "name": system.CONTROLLER_DEPLOYMENT,
                "namespace": system.CONTROLLER_NAMESPACE,
                "labels": dict(SYSTEM_LABELS),
            },
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[controller_policy])
            ),
        )
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": NAMESPACE, "labels": dict(POD_SECURITY)},
            opts=on_cluster,
        )
        in_namespace = pulumi.ResourceOptions.merge(
            on_cluster, pulumi.ResourceOptions(depends_on=[namespace])
        )
        if api_key is not None:
            k8s.core.v1.Secret(
                f"{name}-api-key",
                metadata={"name": f"{LWS_NAME}-api-key", "namespace": NAMESPACE},
                type="Opaque",
                string_data={API_KEY_CREDENTIAL: api_key},
                opts=in_namespace,
            )
        for obj in rendered:
            self._apply(name, obj, in_namespace, ready)

    def _role(
        self,
        name: str,
        trust: dict[str, Any],
        policies: Sequence[str],
        config: ClusterConfig,
    ) -> tuple[aws.iam.Role, list[aws.iam.RolePolicyAttachment]]:
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=json.dumps(trust),
            tags=self._aws.tags(config, name.rsplit("-", 1)[-1]),
            opts=child,
        )
        attached = [
            aws.iam.RolePolicyAttachment(
                f"{name}-{policy}",
                role=role.name,
                policy_arn=f"{aws_facts.AWS_POLICY}{policy}",
                opts=child,
            )
            for policy in policies
        ]
        return role, attached

    def _node_group(
        self,
        pool: NodePool,
        config: ClusterConfig,
        *,
        name: str,
        cluster: aws.eks.Cluster,
        role: tuple[aws.iam.Role, list[aws.iam.RolePolicyAttachment]],
        subnet: aws.ec2.Subnet,
        placement: aws.ec2.PlacementGroup,
        network: list[pulumi.Resource],
    ) -> aws.eks.NodeGroup:
        child = pulumi.ResourceOptions(parent=self)
        tags = {**self._aws.tags(config, pool.role), "Name": f"{name}-{pool.role}"}
        # The model is on the node's root volume (its throughput within a launch's range: the
        # config check).
        provisioned = aws_facts.FACTS.disk.provision(pool.disk_throughput_mibps)
        disk: aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgsDict = {
            "volume_size": pool.disk_gb,
            "volume_type": "gp3",
            "throughput": provisioned.throughput_mibps,
            "iops": provisioned.iops,
            "encrypted": "true",
            "delete_on_termination": "true",
        }
        template = aws.ec2.LaunchTemplate(
            f"{name}-{pool.role}-template",
            description=f"llama-rpc-cluster {pool.role}: IMDSv2, encrypted gp3, placement",
            # IMDSv2 only, one hop: the node's own agents read it, pods (a hop further) cannot
            # take the node's role.
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": "required",
                "http_put_response_hop_limit": 1,
            },
            block_device_mappings=[{"device_name": ROOT_DEVICE, "ebs": disk}],
            placement={"group_name": placement.name},
            tag_specifications=[
                {"resource_type": "instance", "tags": tags},
                {"resource_type": "volume", "tags": tags},
            ],
            update_default_version=True,
            tags=tags,
            opts=child,
        )
        node_role, attached = role
        group = aws.eks.NodeGroup(
            f"{name}-{pool.role}",
            cluster_name=cluster.name,
            node_role_arn=node_role.arn,
            subnet_ids=[subnet.id],
            ami_type=aws_facts.EKS_NODE_AMI_TYPE,
            capacity_type="ON_DEMAND",
            instance_types=[pool.instance_type],
            scaling_config={
                "desired_size": pool.count,
                "min_size": pool.count,
                "max_size": pool.count,
            },
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            update_config={"max_unavailable": 1},
            labels={ROLE_LABEL: pool.role},
            tags=tags,
            # A node joins with the CNI in strict mode, its role's agent and the DNS's policy
            # already in place: no pod on it starts in the standard mode.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*attached, *network]),
        )
        return group

    def _apply(
        self,
        name: str,
        obj: dict[str, Any],
        opts: pulumi.ResourceOptions,
        controller: pulumi.Resource,
    ) -> None:
        """One rendered object as its typed resource (the LeaderWorkerSet after its controller is
        ready, whose webhook admits it)."""
        kind, metadata = obj["kind"], obj["metadata"]
        logical = f"{name}-{metadata['name']}"
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        if kind == "LeaderWorkerSet":
            k8s.apiextensions.CustomResource(
                logical,
                api_version=obj["apiVersion"],
                kind=kind,
                metadata=metadata,
                spec=body["spec"],
                opts=pulumi.ResourceOptions.merge(
                    opts, pulumi.ResourceOptions(depends_on=[controller])
                ),
            )
            return
        KINDS[kind](logical, metadata=metadata, **body, opts=opts)


def connect_command(config: ClusterConfig, cluster: str, profile: str | None = None) -> str:
    """kubectl's credentials for the cluster, then the API's Service on this machine."""
    port = config.server_port
    with_profile = f" --profile {shlex.quote(profile)}" if profile else ""
    return (
        f"aws eks update-kubeconfig --region {config.region} --name {cluster}{with_profile} && "
        f"kubectl -n {NAMESPACE} port-forward service/{LWS_NAME}-api {port}:{port}"
    )


def limitations(config: ClusterConfig) -> dict[str, str]:
    found = {
        "commands": "lrc status, wait, top, exec and start read VMs through SSM; on Kubernetes, "
        f"kubectl -n {NAMESPACE} get pods and logs show the same (docs/kubernetes.md)",
        "addresses": "pods' addresses change as they restart: the outputs name the leaders and "
        "workers by their DNS names inside the cluster",
    }
    if not config.kubernetes_api_cidrs:
        found["endpoint"] = (
            "the Kubernetes API is private: `pulumi up` and kubectl must run inside the VPC "
            "(or set kubernetesApiCidrs to the addresses they run from)"
        )
    return found

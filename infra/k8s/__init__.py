"""``lrc k8s render``: a stack's cluster as Kubernetes objects and the image's build context, for
any Kubernetes cluster (``infra.stack.kube`` makes them; the EKS stack applies the same ones)."""

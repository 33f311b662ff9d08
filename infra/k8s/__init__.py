"""The same cluster on Kubernetes: a stack's serving groups as a LeaderWorkerSet, rendered from the
boot settings its VMs get (``infra.k8s.objects``), with the image recipe built from the same boot
files (``infra.k8s.image``) and the checks a cluster's API server would make (``infra.k8s.schema``).
"""

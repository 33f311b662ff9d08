"""The cluster on Kubernetes: the serving groups as a LeaderWorkerSet and its companions, rendered
from the boot settings the VMs get (``objects``), the image recipe from the same boot files
(``image``), and the EKS stack that runs them (``eks``)."""

"""The product on one machine: the cloud's boot scripts, run in network namespaces."""

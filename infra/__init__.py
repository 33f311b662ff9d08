"""llama-rpc-cluster: private llama.cpp RPC clusters on Arm cloud CPUs."""

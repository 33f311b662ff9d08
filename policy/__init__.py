"""The llama-rpc-cluster-security policy pack (see README.md); the tests import ``policy.rules``."""

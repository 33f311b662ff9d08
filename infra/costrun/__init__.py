"""Provider-comparison cost runs: deploy each stack, wait until it serves, benchmark it, destroy
it, prove nothing is left, and report the providers side by side, measured next to predicted.

``python -m infra.costrun run --stacks aws-c8g,gcp-c4a,azure-cobalt`` (or ``--local``).
"""

"""Provider-comparison cost runs: deploy each stack, wait until it serves, benchmark it, destroy
it, prove nothing is left, and report the providers side by side, measured next to predicted.

``lrc costrun run --stack aws-c8g --stack gcp-c4a --stack azure-cobalt`` (or ``--local``).
"""

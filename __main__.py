"""llama-rpc-cluster: `pulumi up --stack aws-c8g`. The program lives in the infra package."""

from infra.stack.program import run

run()

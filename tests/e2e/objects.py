"""The objects e2e tests make of their own (beyond deploy/examples): a claim template of one
request, and a pod with one container that uses claims made from templates."""

from typing import Any

# What the example pods print (tests/support/examples.py reads it).
REPORT = ["sh", "-c", "echo '== env'; env | sort; echo '== /dev'; ls -1 /dev"]


def claim_template(name: str, request: dict[str, Any], request_name: str = "devices") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": request_name, "exactly": request}]}}},
    }


def claim_pod(name: str, templates: list[str], command: list[str] = REPORT) -> dict[str, Any]:
    """One claim per template, named after it, all for the pod's one container; it stops at once
    when deleted."""
    claims = [{"name": template, "resourceClaimTemplateName": template} for template in templates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": claims,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.37",
                    "command": command,
                    "resources": {"claims": [{"name": claim["name"]} for claim in claims]},
                }
            ],
        },
    }

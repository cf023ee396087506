"""kwok's Stages for the benchmark's nodes and pods: what a kubelet would report, and no more.

kwok does nothing on its own: each change it makes is a Stage (an object selector and the status
it patches in). Three suffice here: a fake Node becomes Ready with an address; a pod bound to one
becomes Running; a pod being deleted is removed (there is no kubelet to confirm it). Its lease
is kept by kwok itself (--node-lease-duration-seconds), which is the heartbeat the node-lifecycle
controller reads.
"""

from typing import Any

import yaml

API = "kwok.x-k8s.io/v1alpha1"

_NODE_STATUS = """\
{{ $now := Now }}
conditions:
- type: Ready
  status: "True"
  reason: KwokNodeReady
  message: kept Ready by kwok for the dra-driver cluster benchmark
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
addresses:
- type: InternalIP
  address: {{ NodeIP | Quote }}
- type: Hostname
  address: {{ NodeName | Quote }}
phase: Running
"""

_POD_STATUS = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
conditions:
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
"""


def _stage(name: str, kind: str, expressions: list[dict[str, Any]], then: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": expressions},
            "next": then,
        },
    }


def _is(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def stages() -> list[dict[str, Any]]:
    ready = '.status.conditions.[] | select( .type == "Ready" ) | .status'
    return [
        _stage("node-ready", "Node", [_is(ready, "NotIn", "True")], {"statusTemplate": _NODE_STATUS}),
        _stage(
            "pod-running",
            "Pod",
            [
                _is(".metadata.deletionTimestamp", "DoesNotExist"),
                _is(".spec.nodeName", "Exists"),
                _is(".status.phase", "In", "Pending"),
            ],
            {"statusTemplate": _POD_STATUS},
        ),
        _stage("pod-delete", "Pod", [_is(".metadata.deletionTimestamp", "Exists")], {"delete": True}),
    ]


def stages_yaml() -> str:
    return yaml.safe_dump_all(stages(), sort_keys=False)

"""kwok's side of the local stack: the Stages that make kwok's fake kubelets act (kwok v0.8.0
has none built in) and the body of a Node kwok manages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEAD_NODE_POD", "KWOK_ANNOTATION", "KWOK_STAGES", "fake_node"]

#: the annotation that tells kwok to manage a Node
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

#: the annotation on a pod whose Node died (:mod:`healer_dev.devstack.dead_node`): kwok does
#: not finish its deletion, as no dead kubelet can (a force delete still removes it)
DEAD_NODE_POD = "healer-dev/node-dead"

#: kwok v0.8.0 has no built-in behaviour: with no Stage in its configuration it exits with
#: "no stages found". healer's own minimal stages (written here against kwok's Stage API):
#: a managed Node becomes Ready once (conditions are not rewritten afterwards, so a test may
#: add its own), a Pod bound to a managed Node runs and is Ready (a slurmd pod runs unready:
#: :mod:`healer_dev.devstack.podruntime` makes it Ready once its real slurmd registered, as the
#: container's readiness probe would), a Job's Pod succeeds (or
#: fails, when labelled healer-test-outcome=fail; its container's termination message is the
#: pod's annotation healer-test-message, if any), a Pod being deleted goes away unless its Node
#: died (:data:`DEAD_NODE_POD`). Node liveness comes from the Leases kwok renews.
KWOK_STAGES = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: healer-node-up
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.phase', operator: NotIn, values: [Running]}
  next:
    statusTemplate: |
      {{ $t := Now | Quote }}
      phase: Running
      conditions:
      - {type: Ready, status: "True", reason: FakeKubelet, message: "kwok keeps this node alive",
         lastHeartbeatTime: {{ $t }}, lastTransitionTime: {{ $t }}}
      - {type: MemoryPressure, status: "False", reason: FakeKubelet, message: "",
         lastHeartbeatTime: {{ $t }}, lastTransitionTime: {{ $t }}}
      - {type: DiskPressure, status: "False", reason: FakeKubelet, message: "",
         lastHeartbeatTime: {{ $t }}, lastTransitionTime: {{ $t }}}
      - {type: PIDPressure, status: "False", reason: FakeKubelet, message: "",
         lastHeartbeatTime: {{ $t }}, lastTransitionTime: {{ $t }}}
      addresses:
      - {type: InternalIP, address: {{ NodeIP | Quote }}}
      - {type: Hostname, address: {{ .metadata.name | Quote }}}
      nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: fake,
                 containerRuntimeVersion: fake, kernelVersion: fake, osImage: fake,
                 kubeProxyVersion: fake, machineID: "", systemUUID: "", bootID: ""}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: healer-pod-running
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Pending]}
    - {key: '.metadata.labels["app.kubernetes.io/name"]', operator: NotIn, values: [slurmd]}
  next:
    statusTemplate: |
      {{ $t := Now | Quote }}
      phase: Running
      startTime: {{ $t }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $t }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $t }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $t }}}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0,
         started: true, state: {running: {startedAt: {{ $t }}}}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: healer-slurmd-pod-started
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Pending]}
    - {key: '.metadata.labels["app.kubernetes.io/name"]', operator: In, values: [slurmd]}
  next:
    statusTemplate: |
      {{ $t := Now | Quote }}
      phase: Running
      startTime: {{ $t }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $t }}}
      - {type: ContainersReady, status: "False", lastTransitionTime: {{ $t }}}
      - {type: Ready, status: "False", lastTransitionTime: {{ $t }}}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 0,
         started: true, state: {running: {startedAt: {{ $t }}}}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: healer-job-pod-fails
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Running]}
    - {key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}
    - {key: '.metadata.labels["healer-test-outcome"]', operator: In, values: [fail]}
  next:
    statusTemplate: |
      {{ $t := Now | Quote }}
      {{ $msg := "" }}
      {{ with .metadata.annotations }}{{ with index . "healer-test-message" }}
      {{ $msg = . }}
      {{ end }}{{ end }}
      phase: Failed
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 0,
         started: false, state: {terminated: {exitCode: 1, reason: Error,
                                              startedAt: {{ $t }}, finishedAt: {{ $t }},
           message: {{ $msg | Quote }}}}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: healer-job-pod-succeeds
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Running]}
    - {key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}
    - {key: '.metadata.labels["healer-test-outcome"]', operator: NotIn, values: [fail]}
  next:
    statusTemplate: |
      {{ $t := Now | Quote }}
      {{ $msg := "" }}
      {{ with .metadata.annotations }}{{ with index . "healer-test-message" }}
      {{ $msg = . }}
      {{ end }}{{ end }}
      phase: Succeeded
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 0,
         started: false, state: {terminated: {exitCode: 0, reason: Completed,
                                              startedAt: {{ $t }}, finishedAt: {{ $t }},
           message: {{ $msg | Quote }}}}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: healer-pod-gone
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.metadata.annotations["healer-dev/node-dead"]', operator: DoesNotExist}
  next:
    delete: true
"""


def fake_node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The body of a Node that kwok will manage (keep Ready, run Pods bound to it)."""
    cap = {"cpu": "32", "memory": "256Gi", "pods": "110", **(capacity or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1], **(annotations or {})},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {"capacity": cap, "allocatable": dict(cap)},
    }

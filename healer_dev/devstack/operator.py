"""SchedMD's slurm-operator, the real program, running out of cluster against the local stack.

``hack/build-operator.sh`` builds the operator's ``manager`` (and, from v1.1, its ``webhook``) from
the Go module proxy into ``~/.cache/healer/bin/slurm-operator-<version>/`` with that version's
CRDs (``crds/``). :class:`SlinkyOperator` then runs them the way a Helm install would in a
cluster, with what differs out of cluster said here:

* the CRDs of its version are applied (replacing another version's) and waited for;
* v1.1+: the webhook serves on 127.0.0.1 with a certificate from a private CA, and a
  ``MutatingWebhookConfiguration`` registers its pod-binding hook (``/mutate--v1-binding``,
  ``pods/binding`` CREATE, ``failurePolicy: Fail``, every namespace but ``kube-system``) with a
  ``url`` instead of the chart's in-cluster Service; so the scheduler's binding of a slurmd pod
  copies the Node's ``topology.slinky.slurm.net/spec`` to the pod as on a real cluster. (The
  chart also registers validating/defaulting hooks for the CRs; they are not registered here.)
* the manager runs with ``DEBUG=1``: its Slurm client then calls ``http://localhost:6820``
  instead of the RestApi's in-cluster Service, which is where the devstack's Slurm 26.05 serves
  its real slurmrestd (:mod:`healer_dev.devstack.slinky_stack`). Hence one operator per machine
  at a time.

:func:`cluster_objects` and :func:`nodeset` build the objects the ``slurm`` Helm chart creates
(Secrets for the Slurm and JWT keys, Controller, RestApi, NodeSets with ``controllerRef`` name and
namespace and an explicit ``updateStrategy``). The Controller's and RestApi's own pods are
scheduled by the real scheduler and "run" under kwok (no slurmctld in them: the real slurmctld
is the devstack's :class:`~healer_dev.devstack.slurm.LocalSlurm`); the operator creates its Slurm
client once the RestApi Deployment reports a ready replica.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import yaml

from healer.errors import ConfigError
from healer_dev.devstack.binaries import cache_dir
from healer_dev.devstack.certs import CertificateAuthority
from healer_dev.devstack.children import ChildProcess
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.net import LOOPBACK, free_port, listening

__all__ = ["DEFAULT_VERSION", "SUPPORTED_VERSIONS", "SlinkyOperator", "cluster_objects",
           "ensure_built", "nodeset", "operator_dir"]

SUPPORTED_VERSIONS = ("v1.1.0", "v1.0.0")
DEFAULT_VERSION = "v1.1.0"
GROUP, VERSION = "slinky.slurm.net", "v1beta1"
RESTD_PORT = 6820  # the port the operator's client calls with DEBUG=1
WEBHOOK_NAME = "healer-devstack-slurm-operator"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-operator.sh"
_POLL = 0.1


def operator_dir(version: str) -> Path:
    return cache_dir() / "bin" / f"slurm-operator-{version}"


def has_webhook(version: str) -> bool:
    """The pod-binding webhook (topology copy) exists from v1.1 on."""
    return not version.startswith("v1.0.")


def _built(version: str) -> bool:
    d = operator_dir(version)
    need = ["manager", *(["webhook"] if has_webhook(version) else [])]
    return all(os.access(d / b, os.X_OK) for b in need) and (d / "crds").is_dir()


def ensure_built(versions: Sequence[str] = (DEFAULT_VERSION,), *, echo: bool = False) -> None:
    """Build the operator versions that are not in the cache yet (a warm cache returns at once);
    :class:`ConfigError` with the script's last lines when the build fails."""
    for v in versions:
        if v not in SUPPORTED_VERSIONS:
            raise ConfigError(f"slurm-operator {v} is not supported here "
                              f"(supported: {', '.join(SUPPORTED_VERSIONS)})")
    todo = [v for v in versions if not _built(v)]
    if not todo:
        return
    env = {**os.environ, "OPERATOR_VERSIONS": " ".join(todo), "HEALER_CACHE": str(cache_dir())}
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=None if echo else subprocess.PIPE,
                          text=True, check=False)
    if proc.returncode != 0 or any(not _built(v) for v in todo):
        tail = "\n".join((proc.stderr or "").splitlines()[-20:])
        raise ConfigError(f"{BUILD_SCRIPT.name} could not build slurm-operator "
                          f"{' '.join(todo)} (exit {proc.returncode}):\n{tail}")


def build_info(version: str) -> str:
    """What was built (operator version, the Slurm client it was built against)."""
    try:
        return (operator_dir(version) / "BUILD-INFO").read_text().strip()
    except OSError:
        return f"operator {version}"


def _secret(namespace: str, name: str, key: str, value: bytes) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque", "data": {key: base64.b64encode(value).decode()}}


def cluster_objects(namespace: str, cluster: str, *, jwt_key: bytes,
                    slurm_key: bytes) -> list[dict[str, Any]]:
    """Secrets (Slurm key, JWT HS256 key), the Controller and the RestApi of one Slurm cluster,
    as the ``slurm`` chart creates them (persistence off: kwok has no volumes)."""
    ref = {"name": cluster, "namespace": namespace}
    return [
        _secret(namespace, f"{cluster}-auth-slurm", "slurm.key", slurm_key),
        _secret(namespace, f"{cluster}-auth-jwths256", "jwt_hs256.key", jwt_key),
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Controller",
         "metadata": {"name": cluster, "namespace": namespace},
         "spec": {"clusterName": cluster,
                  "slurmKeyRef": {"name": f"{cluster}-auth-slurm", "key": "slurm.key"},
                  "jwtHs256KeyRef": {"name": f"{cluster}-auth-jwths256",
                                     "key": "jwt_hs256.key"},
                  "slurmctld": {"image": "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04"},
                  "reconfigure": {"image": "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04"},
                  "logfile": {"image": "docker.io/library/alpine:latest"},
                  "persistence": {"enabled": False}}},
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RestApi",
         "metadata": {"name": cluster, "namespace": namespace},
         "spec": {"controllerRef": ref, "replicas": 1,
                  "slurmrestd": {"image": "ghcr.io/slinkyproject/slurmrestd:25.11-ubuntu24.04"}}},
    ]


def nodeset(namespace: str, name: str, cluster: str, *, replicas: int,
            node_selector: Mapping[str, str], scaling_mode: str | None = "StatefulSet",
            update_strategy: Mapping[str, Any] | None = None,
            gpus: int = 0, tolerations: Sequence[Mapping[str, Any]] = (),
            host_network: bool = False, labels: Mapping[str, str] | None = None,
            extra_conf: str = "") -> dict[str, Any]:
    """A NodeSet as the chart writes it. ``scaling_mode=None`` leaves the field out (v1.0 has
    none). ``gpus`` > 0 requests ``nvidia.com/gpu`` so one slurmd fits a GPU Node, as on a real
    GPU cluster (the operator adds no affinity: resources and selectors decide placement)."""
    pod_spec: dict[str, Any] = {"nodeSelector": dict(node_selector)}
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]
    if host_network:
        pod_spec["hostNetwork"] = True
    slurmd: dict[str, Any] = {"image": "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04"}
    if gpus:
        slurmd["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)},
                               "requests": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {
        "controllerRef": {"name": cluster, "namespace": namespace},
        "replicas": replicas,
        "slurmd": slurmd,
        "logfile": {"image": "docker.io/library/alpine:latest"},
        "template": {"metadata": {"labels": dict(labels or {})}, "spec": pod_spec},
        "updateStrategy": dict(update_strategy or
                               {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": "25%"}}),
    }
    if scaling_mode is not None:
        spec["scalingMode"] = scaling_mode
    if extra_conf:
        spec["extraConf"] = extra_conf
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeSet",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


class SlinkyOperator:
    """The operator's manager (+ webhook from v1.1) as child processes of this one.

    >>> with SlinkyOperator(stack, "v1.1.0", workdir) as op:   # doctest: +SKIP
    ...     op.apply(cluster_objects("slurm", "slurm", jwt_key=k, slurm_key=s))
    """

    def __init__(self, stack: KubeStack, version: str = DEFAULT_VERSION, *,
                 workdir: Path, start_timeout: float = 60.0) -> None:
        if version not in SUPPORTED_VERSIONS:
            raise ConfigError(f"slurm-operator {version} is not supported here "
                              f"(supported: {', '.join(SUPPORTED_VERSIONS)})")
        self.stack = stack
        self.version = version
        self.workdir = Path(workdir)
        self.start_timeout = start_timeout
        self.bin = operator_dir(version)
        self._procs: list[ChildProcess] = []
        self.webhook_port = 0
        self.timings: dict[str, float] = {}

    @property
    def topology_copy(self) -> bool:
        """Whether this operator copies a Node's topology spec to the slurmd pod."""
        return has_webhook(self.version)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Self:
        t0 = time.monotonic()
        if not _built(self.version):
            raise ConfigError(f"slurm-operator {self.version} is not built under {self.bin}; "
                              "run hack/build-operator.sh")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._install_crds()
            if has_webhook(self.version):
                self._start_webhook()
            else:
                self._unregister_webhook()
            self._start_manager()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the processes (SIGTERM, then SIGKILL their groups); the webhook registration
        goes first, so the API server never calls a webhook that is gone. Idempotent."""
        if any(p.name == "slurm-operator-webhook" for p in self._procs):
            with contextlib.suppress(Exception):
                self._unregister_webhook()
        live = [p for p in self._procs if p.running()]
        for p in live:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in live:
            if not p.wait(deadline):
                p.signal(signal.SIGKILL)
                p.wait(time.monotonic() + 5)
            p.signal(signal.SIGKILL)  # stragglers in its group
        self._procs.clear()

    def running(self) -> bool:
        return bool(self._procs) and all(p.running() for p in self._procs)

    def log(self, which: str = "manager", lines: int = 40, *, without: str = "") -> str:
        """The last ``lines`` lines of a process's log (those containing ``without`` left out)."""
        path = self.workdir / f"{which}.log"
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        kept = [ln for ln in text.splitlines() if not without or without not in ln]
        return "\n".join(kept[-lines:])

    # -- objects -------------------------------------------------------------------------

    def apply(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """Create each object (namespaced ones in their namespace); an existing one is left."""
        for obj in objects:
            path = _collection_path(obj)
            code, body = self.stack.request("POST", path, dict(obj))
            if code not in (200, 201, 202, 409):
                raise ConfigError(f"cannot create {obj.get('kind')} "
                                  f"{obj['metadata'].get('name')}: HTTP {code} {body}")

    # -- internals -----------------------------------------------------------------------

    def _install_crds(self) -> None:
        base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for f in sorted((self.bin / "crds").glob("*.yaml")):
            for crd in yaml.safe_load_all(f.read_text()):
                if not crd:
                    continue
                name = crd["metadata"]["name"]
                names.append(name)
                code, cur = self.stack.request("GET", f"{base}/{name}")
                if code == 200:
                    crd["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                    code, body = self.stack.request("PUT", f"{base}/{name}", crd)
                else:
                    code, body = self.stack.request("POST", base, crd)
                if code not in (200, 201):
                    raise ConfigError(f"cannot install CRD {name} of slurm-operator "
                                      f"{self.version}: HTTP {code} {body}")

        def established() -> bool:
            for name in names:
                code, cur = self.stack.request("GET", f"{base}/{name}")
                conds = ((cur or {}).get("status") or {}).get("conditions") or []
                if code != 200 or not any(c.get("type") == "Established" and
                                          c.get("status") == "True" for c in conds):
                    return False
            return True

        self._wait(established, "the slurm-operator CRDs to be Established")

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> ChildProcess:
        proc = ChildProcess(name=name, argv=argv, log=self.workdir / f"{name.split('-')[-1]}.log")
        self._procs.append(proc)
        proc.spawn(self.workdir, env)
        return proc

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        return env

    def _start_webhook(self) -> None:
        ca = CertificateAuthority.create("healer-devstack-webhook-ca")
        pair = ca.issue_server("slurm-operator-webhook", ("localhost",), (LOOPBACK,))
        tmp = self.workdir / "webhook-tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"
        if certs.exists():
            shutil.rmtree(certs)
        pair.write(certs / "tls.crt", certs / "tls.key")
        self.webhook_port = free_port()
        health = free_port()
        # controller-runtime reads its serving certificate from $TMPDIR/k8s-webhook-server/
        proc = self._spawn("slurm-operator-webhook", [
            str(self.bin / "webhook"), f"--kubeconfig={self.stack.kubeconfig}",
            f"--server-addr={LOOPBACK}:{self.webhook_port}",
            f"--health-addr={LOOPBACK}:{health}", "--metrics-addr=0"],
            {**self._env(), "TMPDIR": str(tmp)})
        self._wait(lambda: listening(LOOPBACK, self.webhook_port) or self._died(proc),
                   f"the slurm-operator webhook to listen on {LOOPBACK}:{self.webhook_port}")
        self._died(proc, fail=True)
        hook = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_NAME},
            "webhooks": [{
                "name": "podsbinding-v1.kb.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": f"https://{LOOPBACK}:{self.webhook_port}/mutate--v1-binding",
                    "caBundle": base64.b64encode(ca.cert_pem).decode()},
                "failurePolicy": "Fail", "matchPolicy": "Equivalent", "sideEffects": "None",
                "namespaceSelector": {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                    "values": ["kube-system"]}]},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods/binding"]}],
                "timeoutSeconds": 10}]}
        self._unregister_webhook()
        code, body = self.stack.request(
            "POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", hook)
        if code not in (200, 201):
            raise ConfigError(f"cannot register the slurm-operator webhook: HTTP {code} {body}")

    def _unregister_webhook(self) -> None:
        self.stack.request("DELETE", "/apis/admissionregistration.k8s.io/v1/"
                                     f"mutatingwebhookconfigurations/{WEBHOOK_NAME}")

    def _start_manager(self) -> None:
        health = free_port()
        proc = self._spawn("slurm-operator-manager", [
            str(self.bin / "manager"), f"--kubeconfig={self.stack.kubeconfig}",
            f"--health-addr={LOOPBACK}:{health}", "--metrics-addr=0"],
            {**self._env(), "DEBUG": "1"})

        def healthy() -> bool:
            if self._died(proc):
                return True
            try:
                import urllib.request
                with urllib.request.urlopen(f"http://{LOOPBACK}:{health}/readyz",
                                            timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        self._wait(healthy, "the slurm-operator manager to be ready (/readyz)")
        self._died(proc, fail=True)

    def _died(self, proc: ChildProcess, *, fail: bool = False) -> bool:
        if proc.running():
            return False
        if fail:
            raise ConfigError(f"{proc.name} {self.version} exited with code "
                              f"{proc.exit_code()}; its log ends:\n"
                              f"{proc.output_since_spawn()[-3000:]}")
        return True

    def _wait(self, ok: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not ok():
            if time.monotonic() > deadline:
                raise ConfigError(f"timed out after {self.start_timeout:.0f} s waiting for "
                                  f"{what}; manager log:\n{self.log('manager', 15)}")
            time.sleep(_POLL)


def _collection_path(obj: Mapping[str, Any]) -> str:
    api = str(obj["apiVersion"])
    kind = str(obj["kind"])
    ns = (obj.get("metadata") or {}).get("namespace")
    plural = {"Secret": "secrets", "Controller": "controllers", "RestApi": "restapis",
              "NodeSet": "nodesets", "Namespace": "namespaces", "Node": "nodes"}.get(kind)
    if plural is None:
        raise ConfigError(f"cannot create a {kind} through SlinkyOperator.apply")
    prefix = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    return f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"


if __name__ == "__main__":  # pragma: no cover - smoke: python -m healer_dev.devstack.operator
    print(json.dumps({v: build_info(v) for v in SUPPORTED_VERSIONS}), file=sys.stderr)

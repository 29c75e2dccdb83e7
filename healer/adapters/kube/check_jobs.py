"""The Jobs that validate a warm spare (:class:`healer.adapters.spare_validation.CheckJobs`).

Each check is a Job template in a ConfigMap ``healer-validation-<check>`` (key ``job.yaml``) in
healer's namespace: ``deploy/validation/`` ships ``dcgm-diag`` and ``nccl-loopback``. healer
names the Job after the spare, the run and the check (creating it twice is a no-op, so a
restarted leader reuses a running Job), pins it to the spare (``nodeName``, tolerating healer's
taints), bounds it (``activeDeadlineSeconds``, no retries), and passes ``HEALER_NODE``,
``HEALER_CHECK``, ``HEALER_RUN`` and ``HEALER_GPU_MODEL`` to its containers. When the Job has
finished, the first container's exit code and termination message are the check's report
(:mod:`healer.core.spare_checks` says their format); a dcgm-diag report's gzip+base64 JSON is
decoded here, at most :data:`MAX_JSON` bytes of it.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any

import yaml
from kubernetes_asyncio import client

from healer.adapters.kube.client import call, to_dict
from healer.adapters.kube.jobs import TOLERATE_ALL_HEALER, job_name, run_once
from healer.adapters.spare_validation import CheckReport
from healer.core.spare_checks import parse_report
from healer.core.spare_validation import SpareCheck
from healer.core.vocabulary import PURPOSE_LABEL
from healer.errors import PermanentError
from healer.ports import StepOutcome

#: The ConfigMap holding a check's Job template is this prefix plus the check's name.
TEMPLATE_PREFIX = "healer-validation-"
#: A dcgm-diag report's JSON is decoded up to this size (a larger one is not read).
MAX_JSON = 1 << 20


def decode_dcgm_json(body: str) -> str | None:
    """The JSON in a dcgm-diag report's body (gzip, then base64), or None when unreadable."""
    try:
        packed = base64.b64decode("".join(body.split()), validate=True)
        inflate = zlib.decompressobj(wbits=47)  # gzip or zlib header
        text = inflate.decompress(packed, MAX_JSON)
    except (binascii.Error, ValueError, zlib.error):
        return None
    if inflate.unconsumed_tail:
        return None
    return text.decode("utf-8", errors="replace")


def parse_template(where: str, text: Any) -> dict[str, Any]:
    """A check's Job template (``job.yaml``), or a PermanentError saying what is wrong with it:
    a bad template stops that check (the step or the loop reports it), never the daemon."""
    if not isinstance(text, str) or not text.strip():
        raise PermanentError(f"{where} has no job.yaml")
    try:
        job = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PermanentError(f"{where}: job.yaml is not YAML: {e}") from None
    if not isinstance(job, dict) or job.get("kind") != "Job":
        raise PermanentError(f"{where}: job.yaml is not a Job manifest (kind: Job)")
    for path, want in ((("metadata",), dict), (("spec",), dict), (("spec", "template"), dict),
                       (("spec", "template", "metadata"), dict),
                       (("spec", "template", "spec"), dict),
                       (("spec", "template", "spec", "containers"), list)):
        node: Any = job
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None and not isinstance(node, want):
            raise PermanentError(f"{where}: job.yaml field {'.'.join(path)}: expected "
                                 f"{'a mapping' if want is dict else 'a list'}")
    containers = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers") or []
    if not containers or not all(isinstance(c, dict) for c in containers):
        raise PermanentError(f"{where}: job.yaml field spec.template.spec.containers: expected "
                             "a list of containers")
    return job


def pinned_job(job: dict[str, Any], *, name: str, namespace: str, node: str, run: str,
               check: str, model: str, deadline: float) -> dict[str, Any]:
    """The template as healer runs it: named, bounded (no retries, ``deadline``), pinned to the
    spare (``nodeName``, tolerating healer's taints), with the run's environment."""
    labels = {"app.kubernetes.io/managed-by": "healer",
              PURPOSE_LABEL: f"validate-spare-{check}"}
    job.setdefault("metadata", {}).update({"name": name, "namespace": namespace})
    job["metadata"].setdefault("labels", {}).update(labels)
    spec = job.setdefault("spec", {})
    spec["activeDeadlineSeconds"] = int(deadline)
    spec["backoffLimit"] = 0
    template = spec.setdefault("template", {})
    template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    pod = template.setdefault("spec", {})
    pod["nodeName"] = node
    pod["restartPolicy"] = "Never"
    pod.setdefault("tolerations", []).extend(TOLERATE_ALL_HEALER)
    env = [{"name": "HEALER_NODE", "value": node},
           {"name": "HEALER_CHECK", "value": check}, {"name": "HEALER_RUN", "value": run},
           {"name": "HEALER_GPU_MODEL", "value": model}]
    for c in pod.get("containers") or []:
        c.setdefault("env", []).extend(env)
    return job


class KubeCheckJobs:
    def __init__(self, api: client.ApiClient, *, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.core = client.CoreV1Api(api)

    async def _template(self, check: str) -> dict[str, Any]:
        name = TEMPLATE_PREFIX + check
        raw = to_dict(self.api, await call(
            f"read ConfigMap {self.namespace}/{name}",
            lambda: self.core.read_namespaced_config_map(name, self.namespace)))
        return parse_template(f"ConfigMap {self.namespace}/{name}",
                              (raw.get("data") or {}).get("job.yaml"))

    async def run(self, node: str, run: str, check: str, *, model: str,
                  deadline: float) -> CheckReport | None:
        name = job_name("healer-spare", f"{node}/{run}", check)

        async def body() -> dict[str, Any]:
            job = await self._template(check)
            try:
                return pinned_job(job, name=name, namespace=self.namespace, node=node,
                                  run=run, check=check, model=model, deadline=deadline)
            except (AttributeError, TypeError) as e:  # e.g. env: or tolerations: not a list
                raise PermanentError(f"ConfigMap {self.namespace}/{TEMPLATE_PREFIX}{check}: "
                                     f"job.yaml has an unexpected shape ({e})") from None

        out = await run_once(self.api, self.namespace, name, body, f"spare {check}",
                             f" on {node}")
        if out.outcome is StepOutcome.PENDING:
            return None
        report = await self._report(name, check)
        if report is not None:
            return report
        if out.outcome is StepOutcome.DONE:
            return CheckReport(0, "", f"{check} Job {name} succeeded without a report")
        return CheckReport(None, "", out.detail)

    async def _report(self, job: str, check: str) -> CheckReport | None:
        """The first container's exit code and termination message of the Job's newest
        finished pod."""
        raw = to_dict(self.api, await call(
            f"list pods of Job {job}", lambda: self.core.list_namespaced_pod(
                self.namespace, label_selector=f"job-name={job}")))
        pods = sorted(raw.get("items") or [],
                      key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        for pod in reversed(pods):
            for st in (pod.get("status") or {}).get("containerStatuses") or []:
                term = (st.get("state") or {}).get("terminated")
                if not term:
                    continue
                message = str(term.get("message") or "")
                parsed = parse_report(message) if message else None
                dcgm = (decode_dcgm_json(parsed.body)
                        if parsed is not None and check == SpareCheck.DCGM_DIAG else None)
                return CheckReport(int(term.get("exitCode", 1)), message, "", dcgm)
        return None

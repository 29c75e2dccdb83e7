"""Webhook and Job hooks, for checkpoints and for the repair hand-off.

The persisted truth of every hook is an annotation on the Node, so nothing is lost when
healer restarts and any system can answer with the RBAC it already has:

* checkpoint acknowledged: ``healer.io/checkpoint-ack: <incident>``
* repair finished: ``healer.io/repair-result: passed|failed`` (with
  ``healer.io/repair-incident: <incident>``, written when the node was handed over)

``webhook`` (HTTPS unless the policy sets ``allowInsecureHttp``): healer POSTs the incident as
JSON, always signed: ``X-Healer-Signature: sha256=<hex HMAC-SHA256 of the body>`` with the key
of *that* hook (the checkpoint and the repair webhook each name their own Secret in
``secretRef``; a webhook without one is refused by the policy validator and, should one reach
here, by :meth:`Secrets.key`), plus ``X-Healer-Event`` and an ``Idempotency-Key``; retried on
connection errors, 429 and 5xx (:data:`healer.adapters.retry.WEBHOOK`). A 2xx answer
``{"status": "done"}`` (or an empty body) acknowledges a checkpoint at once;
``{"status": "pending"}`` means the receiver answers later, by annotating the Node or by POSTing
a signed, timestamped, single-use ack to healer's ``/v1/hooks/ack``
(:mod:`healer.adapters.acks`), which writes the annotation. A redirect is never followed (it
would re-send the signed body to another host): the step fails and its result says so.

``job``: healer creates a Kubernetes Job from a template (a ConfigMap ``namespace/name`` whose
key ``job.yaml`` holds a Job manifest), named after the incident so it is created once, with
``HEALER_INCIDENT``, ``HEALER_NODE``, ``HEALER_SLURM_NODE`` and ``HEALER_SIGNAL`` in every
container's environment (a repair Job is pinned to the node). Its success acknowledges the
checkpoint, or reports the repair ``passed`` (failure: ``failed``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client

from healer.adapters.clock import SYSTEM_CLOCK
from healer.adapters.kube.client import call, to_dict
from healer.adapters.kube.jobs import TOLERATE_ALL_HEALER, job_name, run_once
from healer.adapters.kube.secrets import SecretToken
from healer.adapters.redirects import refused_redirect
from healer.adapters.retry import WEBHOOK
from healer.core.vocabulary import (
    CHECKPOINT_ACK,
    REPAIR_INCIDENT,
    REPAIR_LABEL,
    REPAIR_PENDING,
    REPAIR_RESULT,
)
from healer.errors import PermanentError, TransientError
from healer.ports import Clock, HookKind, HookResult, HookSpec, NodeAPI, StepOutcome

SIGNATURE = "X-Healer-Signature"
MAX_REMEMBERED = 10_000


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, body), signature or "")


class Secrets:
    """HMAC keys by Secret reference, read through the API (and cached)."""

    def __init__(self, api: client.ApiClient | None) -> None:
        self.api = api
        self._cache: dict[str, SecretToken] = {}

    async def key(self, ref: str) -> bytes:
        if not ref:
            raise PermanentError("a webhook hook needs secretRef (namespace/name[:key]) for "
                                 "its HMAC signature; healer sends no unsigned webhook")
        if self.api is None:
            raise PermanentError("no Kubernetes client to read the webhook secret")
        tok = self._cache.get(ref)
        if tok is None:
            tok = self._cache[ref] = SecretToken(self.api, ref if ":" in ref else ref + ":hmac")
        return (await tok.token()).encode()


class WebhookHook:
    def __init__(self, nodes: NodeAPI, secrets: Secrets,
                 session: aiohttp.ClientSession | None = None, *, timeout: float = 10.0,
                 attempts: int = 3, callback_url: str = "", clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock  # a request's sentAt
        self.nodes = nodes
        self.secrets = secrets
        self._session = session
        self.timeout = timeout
        self.attempts = attempts
        self.callback_url = callback_url
        self._posted: OrderedDict[str, None] = OrderedDict()  # incidents posted (bounded)

    async def post(self, kind: str, spec: HookSpec, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` (it names its ``incident``) signed with ``spec``'s own key, as
        ``X-Healer-Event: kind`` (the fencing webhook, :mod:`healer.adapters.fencing`)."""
        return await self._post(kind, spec, payload)

    async def _post(self, kind: str, spec: HookSpec, payload: dict[str, Any]) -> dict[str, Any]:
        if not spec.url:
            raise PermanentError(f"the {kind} webhook has no url")
        body = json.dumps(payload, sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "X-Healer-Event": kind,
                   "Idempotency-Key": f"{payload['incident']}/{kind}",
                   SIGNATURE: sign(await self.secrets.key(spec.secret_ref), body)}
        session = self._session or aiohttp.ClientSession()

        async def once() -> dict[str, Any]:
            try:
                async with session.post(spec.url, data=body, headers=headers,
                                        timeout=aiohttp.ClientTimeout(self.timeout),
                                        allow_redirects=False) as r:
                    if 300 <= r.status < 400:  # never re-send a signed body elsewhere
                        raise PermanentError(refused_redirect(f"the {kind} webhook", spec.url,
                                                              r.status, r.headers))
                    text = await r.text()
                    if r.status >= 500 or r.status == 429:
                        raise TransientError(f"{kind} webhook {spec.url}: HTTP {r.status}")
                    if r.status >= 400:
                        raise PermanentError(f"{kind} webhook {spec.url}: HTTP {r.status}: "
                                             f"{text[:200]}")
                    try:
                        out = json.loads(text) if text.strip() else {}
                    except ValueError:
                        out = {}
                    return out if isinstance(out, dict) else {}
            except (aiohttp.ClientError, TimeoutError) as e:
                raise TransientError(f"{kind} webhook {spec.url}: {e!r}") from e

        try:
            return await WEBHOOK.but(attempts=self.attempts).run(f"{kind} webhook", once)
        finally:
            if self._session is None:
                await session.close()

    async def checkpoint(self, incident: str, node: str, slurm_node: str,
                         spec: HookSpec) -> HookResult:
        view = await self.nodes.get(node)
        if view.annotations.get(CHECKPOINT_ACK) == incident:
            return HookResult(StepOutcome.DONE, "", {"ack": "annotation"})
        if incident in self._posted:
            return HookResult(StepOutcome.PENDING, "waiting for the checkpoint webhook's ack")
        answer = await self._post("checkpoint", spec, {
            "incident": incident, "node": node, "slurmNode": slurm_node, "signal": spec.signal,
            "callback": self.callback_url, "sentAt": self.clock.now()})
        self._posted[incident] = None
        while len(self._posted) > MAX_REMEMBERED:  # forgetting one only re-POSTs it (idempotent)
            self._posted.popitem(last=False)
        if str(answer.get("status", "done")).lower() == "done":
            await self.nodes.patch_metadata(node, annotations={CHECKPOINT_ACK: incident})
            return HookResult(StepOutcome.DONE, "", {"ack": "webhook"})
        return HookResult(StepOutcome.PENDING, "the checkpoint webhook will acknowledge later")

    async def hand_off(self, incident: str, node: str, spec: HookSpec) -> HookResult:
        await self._post("repair", spec, {"incident": incident, "node": node,
                                          "callback": self.callback_url,
                                          "sentAt": self.clock.now()})
        return HookResult(StepOutcome.DONE)


class JobHook:
    def __init__(self, api: client.ApiClient, nodes: NodeAPI, *, namespace: str) -> None:
        self.api = api
        self.nodes = nodes
        self.namespace = namespace
        self.core = client.CoreV1Api(api)

    async def _template(self, ref: str) -> dict[str, Any]:
        if ref.count("/") != 1:
            raise PermanentError(f"jobTemplate must be NAMESPACE/CONFIGMAP, got {ref!r}")
        ns, name = ref.split("/")
        raw = to_dict(self.api, await call(f"read ConfigMap {ref}",
                                           lambda: self.core.read_namespaced_config_map(name,
                                                                                        ns)))
        text = (raw.get("data") or {}).get("job.yaml")
        if not text:
            raise PermanentError(f"ConfigMap {ref} has no job.yaml")
        job = yaml.safe_load(text)
        if not isinstance(job, dict) or job.get("kind") != "Job":
            raise PermanentError(f"ConfigMap {ref}: job.yaml is not a Job manifest")
        return job

    async def _run(self, purpose: str, incident: str, node: str, slurm_node: str,
                   spec: HookSpec, pin: bool) -> HookResult:
        name = job_name("healer-" + purpose, incident, purpose)

        async def body() -> dict[str, Any]:
            job = await self._template(spec.job_template)
            job.setdefault("metadata", {}).update({"name": name, "namespace": self.namespace})
            job["metadata"].setdefault("labels", {})["app.kubernetes.io/managed-by"] = "healer"
            pod = job.setdefault("spec", {}).setdefault("template", {}).setdefault("spec", {})
            if pin:
                pod["nodeName"] = node
                pod.setdefault("tolerations", []).extend(TOLERATE_ALL_HEALER)
            env = [{"name": "HEALER_INCIDENT", "value": incident},
                   {"name": "HEALER_NODE", "value": node},
                   {"name": "HEALER_SLURM_NODE", "value": slurm_node},
                   {"name": "HEALER_SIGNAL", "value": spec.signal}]
            for c in pod.get("containers") or []:
                c.setdefault("env", []).extend(env)
            return job

        return await run_once(self.api, self.namespace, name, body, purpose)

    async def checkpoint(self, incident: str, node: str, slurm_node: str,
                         spec: HookSpec) -> HookResult:
        return await self._run("checkpoint", incident, node, slurm_node, spec, pin=False)

    async def hand_off(self, incident: str, node: str, spec: HookSpec) -> HookResult:
        out = await self._run("repair", incident, node, "", spec, pin=True)
        if out.outcome is StepOutcome.PENDING:
            return out
        # the Job's end is the repair's result: write it where the flow reads it
        result = "passed" if out.outcome is StepOutcome.DONE else "failed"
        await self.nodes.patch_metadata(node, annotations={REPAIR_RESULT: result})
        return HookResult(StepOutcome.DONE, "", {"result": result})


class RepairRouter:
    """The repair hand-off: label the node (always), then call the policy's hook."""

    def __init__(self, nodes: NodeAPI, hooks: Mapping[HookKind, Any]) -> None:
        self.nodes = nodes
        self.hooks = dict(hooks)

    async def hand_off(self, incident: str, node: str, spec: HookSpec) -> HookResult:
        view = await self.nodes.get(node)
        if view.annotations.get(REPAIR_INCIDENT) != incident:
            await self.nodes.patch_metadata(node, labels={REPAIR_LABEL: REPAIR_PENDING},
                                            annotations={REPAIR_INCIDENT: incident,
                                                         REPAIR_RESULT: None})
        if spec.kind is HookKind.NONE:
            return HookResult(StepOutcome.DONE)
        hook = self.hooks.get(spec.kind)
        if hook is None:
            raise PermanentError(f"no {spec.kind.value!r} repair hook is configured")
        out: HookResult = await hook.hand_off(incident, node, spec)
        return out

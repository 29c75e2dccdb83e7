"""Fixtures for tests against the real local control plane (:mod:`healer_dev.devstack.kube`).

* ``kube_stack`` (session): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
  kwok on loopback, started once and stopped at the end. If it cannot start, every test that
  uses it FAILS with the component and its log tail; nothing is skipped.
* ``kube_api`` (function, async): a ``kubernetes_asyncio`` ``ApiClient`` for the admin
  kubeconfig, closed afterwards.
* ``namespace`` (function, async): a fresh namespace whose ``default`` ServiceAccount exists
  (Pods can be created at once); deleted afterwards.

Every test under ``tests/integration`` gets the ``integration`` marker. When the session will
run a test that needs ``kube_stack``, the binaries are built (``hack/build-k8s.sh``; a warm
cache returns at once) before the first test, outside the per-test timeout.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from healer.errors import ConfigError
from healer_dev.devstack import binaries
from healer_dev.devstack import operator as slinky_operator
from healer_dev.devstack.kube import KubeStack
from tests.integration.slinky_fixtures import (  # noqa: F401  (fixtures for every test here)
    operator_version,
    slinky_cluster,
    slinky_stack,
)
from tests.integration.waiting import wait_for

HERE = Path(__file__).resolve().parent
_NEEDS_KUBE = pytest.StashKey[bool]()
_BUILD_ERROR = pytest.StashKey[str]()
_NEEDS_OPERATOR = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs_kube = needs_operator = False
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.integration)
            names = getattr(item, "fixturenames", ())
            if "kube_stack" in names:
                needs_kube = True
            if "slinky_stack" in names:
                needs_operator = True
    config.stash[_NEEDS_KUBE] = needs_kube
    config.stash[_NEEDS_OPERATOR] = needs_operator


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Build missing control-plane binaries (and SchedMD's operator, when a test runs it)
    once, before any test's timeout starts."""
    config = session.config
    if config.option.collectonly or not config.stash.get(_NEEDS_KUBE, False):
        return
    needs_helm = any(item.path.name == "test_helm.py" for item in session.items)
    if binaries.missing() or (needs_helm and binaries.missing(["helm"])):
        try:
            binaries.ensure(helm=needs_helm, echo=True)
        except ConfigError as e:
            config.stash[_BUILD_ERROR] = str(e)
    if config.stash.get(_NEEDS_OPERATOR, False) and not config.stash.get(_BUILD_ERROR, ""):
        try:
            slinky_operator.ensure_built(slinky_operator.SUPPORTED_VERSIONS, echo=True)
        except ConfigError as e:
            config.stash[_BUILD_ERROR] = str(e)


@pytest.fixture(scope="session")
def kube_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeStack]:
    build_error = request.config.stash.get(_BUILD_ERROR, None)
    if build_error:
        pytest.fail(f"the control-plane binaries could not be built:\n{build_error}", pytrace=False)
    stack = KubeStack(tmp_path_factory.mktemp("kube"), controllers=True, kwok=True)
    try:
        stack.start()
    except ConfigError as e:
        pytest.fail(f"the local Kubernetes control plane did not start:\n{e}", pytrace=False)
    try:
        yield stack
    finally:
        stack.stop()


async def api_client_for(kubeconfig: Path) -> client.ApiClient:
    """A kubernetes_asyncio ApiClient for ``kubeconfig`` (the caller closes it)."""
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=cfg, persist_config=False
    )
    return client.ApiClient(configuration=cfg)


@pytest.fixture
async def kube_api(kube_stack: KubeStack) -> AsyncIterator[client.ApiClient]:
    api = await api_client_for(kube_stack.kubeconfig)
    try:
        yield api
    finally:
        await api.close()


def _namespace_name(test_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")
    base = re.sub(r"^test-?", "", base)[:48].strip("-") or "t"
    return f"t-{base}-{secrets.token_hex(3)}"


@pytest.fixture
async def namespace(
    request: pytest.FixtureRequest, kube_api: client.ApiClient
) -> AsyncIterator[str]:
    core = client.CoreV1Api(kube_api)
    name = _namespace_name(request.node.name)
    await core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"healer.io/test": "1"}))
    )

    async def default_sa() -> bool:
        sas = await core.list_namespaced_service_account(name)
        return any(sa.metadata.name == "default" for sa in sas.items)

    # ServiceAccount admission is on: a Pod is refused until the controller manager has made
    # the namespace's `default` ServiceAccount.
    await wait_for(default_sa, timeout=30, description=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        # The namespace controller finishes the deletion in the background. A test that left
        # kube-apiserver down must not also fail here.
        with contextlib.suppress(ApiException, aiohttp.ClientError, TimeoutError):
            await core.delete_namespace(name)

"""A Slurm driver's optional capabilities are typed handles built from its registry entry: a
handle is None exactly when :data:`healer.core.slurm_drivers.DRIVERS` says the driver (with
its job backend, where its capabilities are its backend's) cannot do that."""

from __future__ import annotations

import pytest

from healer.core.slurm_drivers import DRIVERS, SlurmCapabilities, SlurmDriverKind, capabilities_of
from healer.ports import SlurmHandles, SlurmJob, SlurmNodeState, Undrain, slurm_handles


class Everything:
    """A driver with every optional method (what scontrol, slurmrestd and slinky offer)."""

    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool:
        return True

    async def undrain(self, node: str, incident: str = "", *, host: str = "") -> Undrain:
        return Undrain.CLEARED

    async def close(self) -> None:
        return None

    async def state(self, node: str, *, host: str = "") -> SlurmNodeState:
        return SlurmNodeState(node, "IDLE")

    async def jobs_on(self, node: str) -> list[SlurmJob]:
        return []

    async def signal_jobs(self, node: str, signal: str, *, batch_only: bool = False) -> list[int]:
        return []

    async def requeue_jobs(self, node: str) -> list[int]:
        return []

    async def recent_jobs_on(self, node: str) -> list[SlurmJob]:
        return []

    async def hold(self, node: str, reason: str) -> None:
        return None

    async def delete_node(self, node: str) -> bool:
        return True

    async def nodes(self) -> list[SlurmNodeState]:
        return []

    async def node_states(self) -> dict[str, SlurmNodeState]:
        return {}


def _flags(h: SlurmHandles) -> SlurmCapabilities:
    return SlurmCapabilities(lists_nodes=h.lists_nodes, holds=h.hold is not None,
                             deletes_records=h.records is not None,
                             job_history=h.history is not None)


BACKENDS = [None, *(k for k in SlurmDriverKind if not DRIVERS[k].through_job_backend)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(SlurmDriverKind))
def test_the_handles_are_the_registry_entry(kind: SlurmDriverKind,
                                            backend: SlurmDriverKind | None) -> None:
    d = Everything()
    caps = capabilities_of(kind, backend)
    own = DRIVERS[kind]
    h = slurm_handles(caps, d, states=d) if own.names_by_pod else \
        slurm_handles(caps, d, lister=d)
    assert _flags(h) == caps
    assert h.driver is d
    if not own.through_job_backend or backend is None:
        assert caps == own.capabilities  # no backend: the entry's own capabilities
    else:
        theirs = DRIVERS[backend].capabilities
        for name in SlurmCapabilities.__slots__:
            assert getattr(caps, name) == (getattr(own.capabilities, name)
                                           or getattr(theirs, name))


def test_slinky_alone_lists_nodes_and_nothing_more() -> None:
    d = Everything()
    h = slurm_handles(capabilities_of(SlurmDriverKind.SLINKY), d, states=d)
    assert h.states is d
    assert h.lister is None
    assert (h.hold, h.records, h.history) == (None, None, None)


def test_a_lister_is_needed_where_the_entry_lists_nodes() -> None:
    with pytest.raises(ValueError, match="lists nodes"):
        slurm_handles(capabilities_of(SlurmDriverKind.SCONTROL), Everything())

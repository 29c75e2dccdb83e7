"""The Slurm driver registry: every driver named once, and every reader reads that one table."""

from __future__ import annotations

import pytest

from healer.app import _FACTORIES
from healer.core.slurm_drivers import DRIVERS, SlurmDriverKind
from healer.errors import ConfigError
from healer.policy.schema import SlurmEndpointSpec
from healer.settings import SlurmSettings


def test_every_driver_has_one_entry_and_one_factory() -> None:
    assert set(DRIVERS) == set(SlurmDriverKind)
    assert all(spec.kind is kind for kind, spec in DRIVERS.items())
    assert set(_FACTORIES) == set(SlurmDriverKind)


def test_the_policy_schema_offers_exactly_the_registry() -> None:
    schema = SlurmEndpointSpec.model_json_schema()
    assert schema["properties"]["driver"]["enum"] == [str(k) for k in SlurmDriverKind]


@pytest.mark.parametrize("name", [str(k) for k in SlurmDriverKind])
def test_settings_take_a_drivers_name_as_its_kind(name: str) -> None:
    assert SlurmSettings(driver=name).driver is SlurmDriverKind(name)  # type: ignore[arg-type]


def test_settings_refuse_an_unknown_driver() -> None:
    with pytest.raises(ConfigError, match=r"slurm\.driver: expected one of slinky, scontrol"):
        SlurmSettings(driver="pbs")  # type: ignore[arg-type]


@pytest.mark.parametrize(("driver", "nodeset", "on_slinky"), [
    (SlurmDriverKind.SLINKY, "", True), (SlurmDriverKind.SCONTROL, "", False),
    (SlurmDriverKind.SLURMRESTD, "gpu", True)])
def test_the_slurm_name_is_the_pods_on_slinky(driver: SlurmDriverKind, nodeset: str,
                                              on_slinky: bool) -> None:
    assert SlurmSettings(driver=driver, nodeset=nodeset).on_slinky is on_slinky


def test_a_driver_without_the_settings_it_needs_names_the_flags() -> None:
    with pytest.raises(ConfigError, match="slurmrestd needs --slurmrestd-url and "
                                          "--slurmrestd-token-secret"):
        SlurmSettings(driver=SlurmDriverKind.SLURMRESTD).check_driver()
    SlurmSettings(driver=SlurmDriverKind.SLURMRESTD, slurmrestd_url="http://x:6820",
                  token_secret="slurm/token").check_driver()

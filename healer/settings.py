"""Settings, grouped. Flags and environment variables become these in ``healer.cli``.

Every number is checked when a Settings is built (finite, in range): a bad value is a
:class:`~healer.errors.ConfigError` naming the setting, never a loop that sleeps for ever.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from healer.core.slurm_drivers import DRIVERS, SlurmDriverKind
from healer.errors import ConfigError

#: (setting, lowest, highest) for every number a Settings holds.
LIMITS: dict[str, tuple[float, float]] = {
    "lease_duration": (1.0, 3600.0), "renew_deadline": (1.0, 3600.0),
    "retry_period": (1.0, 600.0), "poll_interval": (0.1, 3600.0), "port": (0, 65535),
    "policy_reload_seconds": (0.1, 86400.0), "policy_load_timeout": (1.0, 3600.0),
    "policy_load_memory_mb": (64, 1 << 20), "shutdown_grace": (0.0, 3600.0),
    "api_qps": (0.0, 100_000.0), "api_burst": (1, 1_000_000),
}


def check(obj: Any, prefix: str = "") -> None:
    """Raise ConfigError for the first number of ``obj`` (a settings dataclass, recursively)
    that is not finite or not within :data:`LIMITS`."""
    for f in fields(obj):
        v = getattr(obj, f.name)
        if is_dataclass(v) and not isinstance(v, type):
            check(v, f"{prefix}{f.name}.")
            continue
        if f.name not in LIMITS or isinstance(v, bool):
            continue
        lo, hi = LIMITS[f.name]
        if not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            raise ConfigError(f"{prefix}{f.name}: expected a number from {lo:g} to {hi:g}, "
                              f"got {v!r}")


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: str | None = None
    """Path to a kubeconfig; None means the in-cluster service account."""
    context: str | None = None
    namespace: str = "healer-system"
    """Where healer's Lease lives."""
    install_crd: bool = False
    """Create the NodeRemediation CRD if it is missing (development only)."""
    pod_name: str = field(default_factory=lambda: os.environ.get("POD_NAME", ""))
    """healer's own Pod (events about healer itself regard it; else the leader Lease)."""
    api_qps: float = 200.0
    """Client-side rate limit: requests per second to the API server once the burst is spent
    (0: no limit). Leases (leader election) are exempt."""
    api_burst: int = 1000
    """Client-side rate limit: requests that may be sent at once."""


@dataclass(frozen=True)
class LeaderSettings:
    enabled: bool = True
    lease_name: str = "healer-leader"
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME")
                          or f"{socket.gethostname()}-{os.getpid()}")
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


#: The flag that sets each Slurm setting a driver may need (its registry entry's ``needs``).
SLURM_FLAGS = {"slurmrestd_url": "--slurmrestd-url",
               "token_secret": "--slurmrestd-token-secret NAMESPACE/NAME[:KEY]",
               "slurm_conf": "--slurm-conf FILE"}


@dataclass(frozen=True)
class SlurmSettings:
    driver: SlurmDriverKind = SlurmDriverKind.SCONTROL
    """Which driver (:data:`healer.core.slurm_drivers.DRIVERS`); its name is accepted too."""
    slurmrestd_url: str = ""
    token_secret: str = ""
    """namespace/name[:key] of the Secret holding the slurmrestd JWT (Slinky's Token)."""
    slurm_conf: str = ""
    """SLURM_CONF for the scontrol driver (empty: the default)."""
    nodeset_namespace: str = "slurm"
    nodeset: str = ""
    """The Slinky NodeSet whose nodes healer remediates (slinky driver / swap)."""
    state_interval: float = 10.0
    """Seconds between reads of every Slurm node's state for the guardrails (0: no Slurm
    feed; the guardrails then count only what Kubernetes shows)."""

    def __post_init__(self) -> None:
        try:  # a driver's name becomes its kind; anything else is refused here
            object.__setattr__(self, "driver", SlurmDriverKind(self.driver))
        except ValueError:
            raise ConfigError(f"slurm.driver: expected one of {', '.join(DRIVERS)}, got "
                              f"{self.driver!r}") from None

    def check_driver(self) -> None:
        """Raise ConfigError, naming the flags, when a setting the driver needs is not set."""
        missing = [SLURM_FLAGS[f] for f in DRIVERS[self.driver].needs if not getattr(self, f)]
        if missing:
            raise ConfigError(f"--slurm-driver {self.driver} needs {' and '.join(missing)}")

    @property
    def on_slinky(self) -> bool:
        """Whether the Slurm node is the slurmd pod's name (the slinky driver, or another
        driver on a Slinky NodeSet), not the Kubernetes node's."""
        return DRIVERS[self.driver].names_by_pod or bool(self.nodeset)


@dataclass(frozen=True)
class TopologySettings:
    source: str = "labels"
    """labels | topograph: where the replacement Node's ``topology.slinky.slurm.net/spec``
    comes from (its topograph fabric labels, or topograph itself through /v1/generate)."""
    topograph_url: str = ""
    """topograph's API, e.g. ``http://topograph.topograph:49021`` (topograph source)."""
    topograph_request: str = ""
    """JSON file with the /v1/generate body (provider, engine, nodes) the operator mounts."""


@dataclass(frozen=True)
class TelemetrySettings:
    prometheus_url: str = ""
    poll_interval: float = 15.0
    bearer_token_file: str = ""
    ca_file: str = ""
    insecure_skip_verify: bool = False
    host_labels: tuple[str, ...] = ("Hostname", "hostname")


@dataclass(frozen=True)
class HttpSettings:
    host: str = "127.0.0.1"
    """The one address to serve on (the chart passes the pod IP)."""
    port: int = 8080
    debug_state: bool = False
    """Serve /debug/state (redacted; off by default)."""


@dataclass(frozen=True)
class Settings:
    policies: tuple[str, ...] = ("policies",)
    dry_run: bool = False
    """Cap every policy at dryRun: record intent, change nothing."""
    policy_reload_seconds: float = 10.0
    """How often the policy files are looked at (a reload happens only when they changed)."""
    policy_load_timeout: float = 30.0
    """Seconds one policy load (in its own child process) may take before it is stopped."""
    policy_load_memory_mb: int = 512
    """Address space (MiB) of the policy loader's child process."""
    log_level: str = "info"
    log_json: bool | None = None
    log_file: str = ""  # append the log here instead of stderr (the demo keeps it in its workdir)
    shutdown_grace: float = 10.0
    """SIGTERM: in-flight actions get this long, then everything is cancelled."""
    callback_url: str = ""
    """Where webhook receivers POST their acknowledgements (this controller's /v1/hooks/ack,
    as reachable from them); sent with every webhook call."""
    kube: KubeSettings = field(default_factory=KubeSettings)
    leader: LeaderSettings = field(default_factory=LeaderSettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    topology: TopologySettings = field(default_factory=TopologySettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    http: HttpSettings = field(default_factory=HttpSettings)

    def __post_init__(self) -> None:
        check(self)

"""``healer run``'s flags checked together before anything starts.

Each flag is checked on its own by its type (:mod:`healer.flags`); here are the combinations
that cannot work, which used to be accepted and fail later, or never: a leader-election timing
the elector refuses (healer would then never lead), a Slurm driver without what it needs, a
flag only another choice reads, a topograph request that is not one. Each is a
:class:`~healer.errors.ConfigError` of one line naming the flags; the CLI prints it and exits 2.
"""

from __future__ import annotations

import math

from healer.core.slurm_drivers import SlurmDriverKind
from healer.errors import ConfigError
from healer.settings import Settings

__all__ = ["JITTER", "check_run_settings"]

#: The leader elector's jitter factor: it refuses a renew deadline not above retry x this.
JITTER = 1.2


def check_run_settings(s: Settings) -> None:
    """Raise ConfigError for the first combination of ``s`` that cannot work."""
    _leader(s)
    _slurm(s)
    _topology(s)
    _telemetry(s)


def _leader(s: Settings) -> None:
    le = s.leader
    if not le.enabled:
        return
    duration = math.ceil(le.lease_duration)  # the Lease stores whole seconds
    if duration <= le.renew_deadline:
        raise ConfigError(f"--lease-duration ({duration}s in the Lease) must be longer than "
                          f"--renew-deadline ({le.renew_deadline:g}s): the leader elector "
                          "refuses it and healer would never lead")
    if le.renew_deadline <= JITTER * le.retry_period:
        raise ConfigError(f"--renew-deadline ({le.renew_deadline:g}s) must be longer than "
                          f"{JITTER:g} x --retry-period ({le.retry_period:g}s): the leader "
                          "elector refuses it and healer would never lead")
    if le.renew_deadline < 1 or le.retry_period < 1:
        raise ConfigError("--renew-deadline and --retry-period must be at least 1s with "
                          "leader election (the elector refuses less)")


def _slurm(s: Settings) -> None:
    sl = s.slurm
    sl.check_driver()
    if bool(sl.slurmrestd_url) != bool(sl.token_secret):
        given, missing = (("--slurmrestd-url", "--slurmrestd-token-secret") if sl.slurmrestd_url
                          else ("--slurmrestd-token-secret", "--slurmrestd-url"))
        raise ConfigError(f"{given} without {missing}: slurmrestd is used only with both")
    if sl.slurm_conf and sl.driver is SlurmDriverKind.SLURMRESTD:
        raise ConfigError(f"--slurm-conf is read by the {SlurmDriverKind.SCONTROL} driver (and "
                          f"by {SlurmDriverKind.SLINKY} for jobs without slurmrestd); "
                          f"--slurm-driver {sl.driver} never reads it")


def _topology(s: Settings) -> None:
    t = s.topology
    if t.source == "topograph":
        if not t.topograph_url or not t.topograph_request:
            raise ConfigError("--topology-source topograph needs --topograph-url and "
                              "--topograph-request FILE")
        from healer.adapters.topograph import load_request

        load_request(t.topograph_request)  # a JSON object topograph can act on, or one line
    elif t.topograph_url or t.topograph_request:
        raise ConfigError("--topograph-url and --topograph-request are read only with "
                          "--topology-source topograph")


def _telemetry(s: Settings) -> None:
    tel = s.telemetry
    if not tel.prometheus_url:
        unused = [flag for flag, given in (
            ("--prometheus-ca-file", tel.ca_file),
            ("--prometheus-bearer-token-file", tel.bearer_token_file),
            ("--prometheus-insecure-skip-verify", tel.insecure_skip_verify)) if given]
        if unused:
            raise ConfigError(f"{', '.join(unused)} without --prometheus-url: never used")
        return
    https = tel.prometheus_url.lower().startswith("https://")
    if tel.ca_file and tel.insecure_skip_verify:
        raise ConfigError("--prometheus-ca-file and --prometheus-insecure-skip-verify "
                          "contradict each other: verify with the CA, or do not verify")
    if not https and (tel.ca_file or tel.insecure_skip_verify):
        flag = "--prometheus-ca-file" if tel.ca_file else "--prometheus-insecure-skip-verify"
        raise ConfigError(f"{flag} applies to an https:// --prometheus-url; "
                          f"{tel.prometheus_url.split('://', 1)[0]}:// has no TLS")

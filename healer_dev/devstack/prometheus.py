"""A private Prometheus on loopback for tests and demos (Debian's ``prometheus`` package).

:class:`LocalPrometheus` writes a ``prometheus.yml`` with one static target per exporter (job
``dcgm``), starts ``prometheus`` on a free loopback port with ``--web.enable-lifecycle`` and its
own TSDB directory, and waits for ``/-/ready``. It can be stopped and started again on the same
port and data directory (to test a Prometheus outage), and reloaded with other targets.

The API is synchronous (a subprocess and stdlib HTTP), so it can be driven from any thread or
fixture; from async code wrap the slow calls in :func:`asyncio.to_thread`.

Timing to know: ``/-/ready`` answers ~0.1 s after the start, but the first sample is queryable
only ~5 s later even at a 1 s scrape interval (Prometheus' target-update tick), so wait for a
series (:meth:`LocalPrometheus.wait_for_series`), not for readiness.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from healer.errors import ConfigError
from healer_dev.devstack.net import free_port

Targets = Sequence[str] | Mapping[str, Mapping[str, str]]


class LocalPrometheus:
    """Prometheus on ``127.0.0.1:<port>`` scraping ``targets`` every ``scrape_interval``.

    ``targets`` is a list of ``host:port``, or a mapping ``host:port → extra target labels``.
    Files live in ``workdir``: ``prometheus.yml``, ``data/`` (the TSDB) and ``prometheus.log``.
    """

    def __init__(self, workdir: str | os.PathLike[str], targets: Targets,
                 scrape_interval: str = "1s", *, job: str = "dcgm", port: int | None = None,
                 host: str = "127.0.0.1", binary: str | None = None,
                 ready_timeout: float = 30.0, extra_args: Sequence[str] = ()) -> None:
        self.workdir = Path(workdir)
        self.scrape_interval = scrape_interval
        self.job = job
        self.host = host
        self._port = port
        self.ready_timeout = ready_timeout
        self.extra_args = tuple(extra_args)
        self._binary = binary
        self._targets: dict[str, dict[str, str]] = _normalise(targets)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- properties -----------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.workdir / "prometheus.yml"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalPrometheus has not been started yet")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def targets(self) -> list[str]:
        return list(self._targets)

    @property
    def labelled_targets(self) -> dict[str, dict[str, str]]:
        """target → its extra labels (what ``reload`` takes back)."""
        return {t: dict(lb) for t, lb in self._targets.items()}

    def config(self) -> dict[str, Any]:
        static = [{"targets": [t], **({"labels": dict(lb)} if lb else {})}
                  for t, lb in self._targets.items()]
        return {
            "global": {"scrape_interval": self.scrape_interval,
                       "evaluation_interval": self.scrape_interval},
            "scrape_configs": [{"job_name": self.job, "static_configs": static}],
        }

    def write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_suffix(".yml.tmp")
        tmp.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        tmp.replace(self.config_path)
        return self.config_path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- lifecycle ------------------------------------------------------------------------

    def _find_binary(self) -> str:
        if self._binary:
            return self._binary
        found = shutil.which("prometheus")
        if found is None:
            raise ConfigError("the prometheus binary is not on PATH (Debian: apt-get install "
                              "prometheus; see docs for the local stack)")
        self._binary = found
        return found

    def start(self) -> None:
        """Start (or start again, on the same port and data dir); wait for ``/-/ready``.

        Raises :class:`ConfigError` with the tail of the log when it does not come up.
        """
        if self.running:
            return
        binary = self._find_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()
        if self._port is None:
            self._port = free_port(self.host)
        args = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address={self.host}:{self._port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
            *self.extra_args,
        ]
        self._close_log()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        try:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            self._close_log()
            raise ConfigError(f"cannot run {binary}: {e}") from e
        deadline = time.monotonic() + self.ready_timeout
        last = ""
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                self._reap()
                raise ConfigError(f"prometheus exited with status {code} during start-up "
                                  f"({self.url}):\n{self.log_tail()}")
            try:
                status, _ = self._http("GET", "/-/ready", timeout=1.0)
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"prometheus at {self.url} was not ready after "
                                  f"{self.ready_timeout:g}s ({last}):\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. The data dir is kept."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(1.0)
        self._proc = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reload(self, targets: Targets) -> None:
        """Rewrite the configuration with ``targets`` and hot-reload it (``POST /-/reload``)."""
        self._targets = _normalise(targets)
        self.write_config()
        if not self.running:
            return
        status, body = self._http("POST", "/-/reload", timeout=10.0)
        if status != 200:
            raise ConfigError(f"prometheus reload failed: HTTP {status} {body[:500]!r}\n"
                              f"{self.log_tail()}")

    # -- queries --------------------------------------------------------------------------

    def query(self, query: str, at: float | None = None, timeout: float = 10.0) -> Any:
        """An instant query; returns ``data.result`` (raises ConfigError on an API error)."""
        params = {"query": query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._api("/api/v1/query", params, timeout)

    def query_range(self, query: str, start: float, end: float, step: float,
                    timeout: float = 30.0) -> Any:
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                  "step": f"{step:g}"}
        return self._api("/api/v1/query_range", params, timeout)

    def wait_for_series(self, query: str, timeout: float = 30.0,
                        interval: float = 0.1) -> list[dict[str, Any]]:
        """Poll ``query`` until it returns at least one series; return the result.

        Raises :class:`TimeoutError` (with the last answer and the log tail) at the deadline.
        """
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                result = self.query(query)
                if isinstance(result, list) and result:
                    return result
                last = result
            except (OSError, ConfigError) as e:
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no series for {query!r} within {timeout:g}s "
                                   f"(last answer: {last!r})\n{self.log_tail(15)}")
            time.sleep(interval)

    def _api(self, path: str, params: Mapping[str, str], timeout: float) -> Any:
        status, body = self._http("GET", path + "?" + urllib.parse.urlencode(params),
                                  timeout=timeout)
        try:
            doc = json.loads(body)
        except ValueError:
            raise ConfigError(f"prometheus answered HTTP {status}: {body[:300]!r}") from None
        if status != 200 or doc.get("status") != "success":
            raise ConfigError(f"prometheus query failed: HTTP {status}: "
                              f"{doc.get('errorType', '')} {doc.get('error', '')}")
        return doc["data"]["result"]

    def _http(self, method: str, path: str, timeout: float) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as e:
            with e:
                return int(e.code), bytes(e.read())


def _normalise(targets: Targets) -> dict[str, dict[str, str]]:
    if isinstance(targets, Mapping):
        return {str(t): {str(k): str(v) for k, v in (lb or {}).items()}
                for t, lb in targets.items()}
    if isinstance(targets, str):
        raise TypeError("targets is a list of host:port, not a string")
    return {str(t): {} for t in targets}

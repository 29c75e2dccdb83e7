"""healer.sim: the one engine replayed in simulated time (``engine``), the simulated world it acts
on (``world``) and scripted fault scenarios (``scenario``), for ``healer simulate`` and
``healer backtest``. The DCGM-exporter and sharding simulators are development tools, in
``healer_dev.sim``."""

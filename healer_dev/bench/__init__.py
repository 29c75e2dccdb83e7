"""``make bench`` (``python -m healer_dev bench``): how fast and how lean healer is, measured on
this machine.

Four groups of figures (see docs/bench.md): ``telemetry`` (CPU and memory of one Prometheus
poll, parse + evaluate, through the real parser), ``engine`` (decisions per second of the pure
engine in simulated time), ``stack`` (the daemon against a real kube-apiserver + kwok) and
``promql`` (DCGM simulator → real Prometheus → daemon → first action). Every figure is printed
as min / median / max over repeats next to its target; nothing here asserts a timing.
"""

"""healer_dev.devstack: the local real stack on loopback for the tests, the demo and the bench:
kube-apiserver/etcd/kwok (``kube``), Slurm 22.05 (``slurm``), Prometheus (``prometheus``),
SchedMD's slurm-operator (``operator``), the slurmrestd v0.0.44 and pod-runtime shims, and
``python -m healer_dev devstack`` (``cli``)."""

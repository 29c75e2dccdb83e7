"""healer_dev.devstack: the local real stack on loopback for the tests, the demo and the bench:
kube-apiserver/etcd/kwok (``kube``), Slurm 22.05, 24.11 and 26.05 (``slurm``, ``slurm_root``:
the newer two from Debian roots), Prometheus (``prometheus``), SchedMD's slurm-operator
(``operator``) over Slurm 26.05's own slurmrestd (``slinky_stack``), the kwok pod runtime that
runs the slurmd pods' real ``slurmd -Z`` (``podruntime``), and ``python -m healer_dev devstack``
(``cli``)."""

"""healer: event-driven GPU node-health remediation for Kubernetes clusters that run Slurm."""

__version__ = "0.1.0"

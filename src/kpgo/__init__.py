"""kpgo: profile-guided optimization of Linux kernels for the workloads they serve."""

__version__ = "0.1.0"

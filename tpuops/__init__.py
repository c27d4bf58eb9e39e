"""tpuops: run TPU-VM procedures (SOPs) as declarative, tested steps."""

__version__ = "0.1.0"

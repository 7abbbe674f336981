"""perfsdk-pyruntime: Python runtime costs during a perfsdk run."""

__version__ = "0.1.0"

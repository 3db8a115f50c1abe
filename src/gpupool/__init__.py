"""gpupool: GPU pool orchestrator for shared Kubernetes clusters."""

__version__ = "0.1.0"

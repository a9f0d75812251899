"""engramctl: stateful local inference for Mamba/Mamba2 hybrid language models."""

__version__ = "0.1.0"

"""sglang-fleet: converge NVIDIA B200 hosts into verified SGLang servers."""

__version__ = "0.1.0"

"""sglang-sim: behaves like ``sglang.launch_server`` from the outside, without a GPU."""

__version__ = "0.1.0"

"""The package version at build time: the SGLang release a lab wheel imitates."""

import os

__version__ = os.environ.get("SGLANG_SIM_RELEASE", "0.1.0")

"""Every path, unit and name the product owns on a host, in one place; the stages, the templates
and teardown take them from here.

    from sglang_fleet import paths
    paths.RELEASES          # '/opt/sglang/releases'
    paths.env_file("sglang-2.service")   # '/etc/sglang/sglang-2.env'
"""

from __future__ import annotations

# The engine: pinned releases side by side, ``current`` and ``previous`` links (root's).
ROOT = "/opt/sglang"
RELEASES = f"{ROOT}/releases"
CURRENT = f"{ROOT}/current"
PREVIOUS = f"{ROOT}/previous"
UV_VENV = f"{ROOT}/uv"  # uv itself, apart from any release
TOOLS = f"{ROOT}/tools"  # the host programs (staging, gate, launchers) and their venv
ROUTER_HOME = f"{ROOT}/router"  # the router's releases

# The service: its own user, a root-owned home holding the staged models, a state directory
# and the kernel caches it may write.
USER = "sglang"
HOME = "/var/lib/sglang"
STATE = f"{HOME}/state"  # the service's home and working directory, its own to write
MODELS = f"{HOME}/models"  # root-owned (0755): the service reads the weights, cannot replace them
SIZING = f"{HOME}/sizing"  # root's: the mamba cache sizes computed for a target (sizing.py)
CACHE = "/var/cache/sglang"  # the service's kernel and hub caches, its own to write
RELEASE_CACHES = f"{CACHE}/release"  # caches.PER_RELEASE ones, one directory per version

# Root's own: uv's download cache and the NVIDIA keyring download (0700), so a compromised
# server cannot poison the next release; the package list from before the first install.
ROOT_CACHE = "/var/cache/sglang-fleet"
UV_CACHE = f"{ROOT_CACHE}/uv"
KEYRING_DIR = f"{ROOT_CACHE}/keyring"
BASELINE_DIR = "/var/lib/sglang-fleet"
# What each unit's last passed gate measured (capacity, throughput), for status and the roll.
GATE_RECORDS = f"{BASELINE_DIR}/gate"
# One empty file per warmed release, flags and environment: root's, as root creates and prunes
# them by name (under CACHE the service could link the directory anywhere).
WARM_MARKS = f"{ROOT_CACHE}/warm"
# One record per release and digest of what its kernels were compiled for (compiled_records.py),
# once a server of it passed the gate or the cache came from a host that did; root's, as the
# marks.
COMPILED = f"{ROOT_CACHE}/compiled"
CACHE_COPY = f"{ROOT_CACHE}/cache-copy"  # a compiled cache's archive on its way (0700)

# Secrets: every secret file of the product, root only (0700 directory, 0600 files).
SECRETS = "/etc/sglang"
LAST_GOOD = f"{SECRETS}/last-good"  # the unit and environment that last passed the gate
AWS_CREDENTIALS = f"{SECRETS}/aws-credentials"
HF_TOKEN = f"{SECRETS}/hf-token"

# systemd units.
UNITS = "/etc/systemd/system"
SERVER_UNIT = "sglang.service"  # sglang-N.service with parallel.instances > 1
SERVER_UNIT_PATTERN = r"sglang(-[0-9]+)?\.service"
ROUTER_UNIT = "sglang-router.service"
ROUTER_CONFIG = "/etc/sglang-router"
ROUTER_WORKERS = f"{ROUTER_CONFIG}/workers.env"  # sglang-router: the list it starts with
ROUTER_WORKERS_JSON = f"{ROUTER_CONFIG}/workers.json"  # smg: the list it watches
ROUTER_CACHE = "/var/cache/sglang-router"  # systemd's CacheDirectory= (DynamicUser) link
ROUTER_CACHE_PRIVATE = "/var/cache/private/sglang-router"

# The environment variables the launchers read the keys from (never the command line).
API_KEY_VAR = "SGLANG_API_KEY"
ADMIN_API_KEY_VAR = "SGLANG_ADMIN_API_KEY"
ROUTER_ADMIN_KEY_VAR = "SGLANG_ROUTER_ADMIN_KEY"


def server_unit(instance: int, instances: int) -> str:
    """The unit of one server instance.

    >>> server_unit(0, 1), server_unit(1, 2)
    ('sglang.service', 'sglang-1.service')
    """
    return SERVER_UNIT if instances == 1 else f"sglang-{instance}.service"


def gate_record(unit: str) -> str:
    """Where the gate keeps what it measured of a unit's server (root's, readable by all).

    >>> gate_record("sglang-3.service")
    '/var/lib/sglang-fleet/gate/sglang-3.json'
    """
    return f"{GATE_RECORDS}/{unit.removesuffix('.service')}.json"


def unit_path(unit: str) -> str:
    return f"{UNITS}/{unit}"


def env_file(unit: str) -> str:
    """A unit's root-only environment file (secrets included).

    >>> env_file("sglang-router.service")
    '/etc/sglang/sglang-router.env'
    """
    return f"{SECRETS}/{unit.removesuffix('.service')}.env"


def template_values() -> dict[str, str]:
    """What the unit templates may name (``paths.user``, ``paths.state``, ...)."""
    return {"user": USER, "home": STATE, "state": STATE, "cache": CACHE,
            "router_cache": ROUTER_CACHE, "tools": TOOLS}


# NVIDIA's CUDA repository (host data ``nvidia_repository`` replaces it) and its keyring package
NVIDIA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
KEYRING = "cuda-keyring_1.1-1_all.deb"

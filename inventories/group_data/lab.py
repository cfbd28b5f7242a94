"""What the lab's site looks like from its hosts: the only place the lab differs.

The NVIDIA repository, the S3 endpoint and its credentials, and the engine package are the
lab's; everything the product does with them is what it does on a B200 site.
"""

import hashlib

from sglang_fleet_lab.site import MODEL_PREFIX, S3_CREDENTIALS, WWW
from sglang_fleet_lab.state import S3_BUCKET, load

_lab = load()

sglang_profile = "qwen3.6-27b-mtp"  # shipped with the product
# The API key: made by `lab up` and kept in the lab's root-only state, never in the repository.
secrets = {"sglang-api-key": _lab.api_key(), "sglang-router-admin-key": _lab.api_key("admin")}
# The lab's site serves plain http (its repository, wheelhouse and S3 endpoint live on
# 127.0.0.2, 127.0.k.2 in lab slot k); a B200 site uses https, which every URL must be unless
# this is set.
allow_insecure_urls = True

# NVIDIA's CUDA repository (developer.download.nvidia.com/compute/cuda/repos on a real site).
nvidia_repo_base_url = _lab.repo_url
# The lab's keyring package is built by `lab up`; NVIDIA's is pinned in the driver stage.
_keyring = WWW / "compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb"
if _keyring.exists():
    nvidia_keyring_sha256 = hashlib.sha256(_keyring.read_bytes()).hexdigest()

# The engine: the SGLang simulator, installed from the lab's wheelhouse like SGLang from PyPI
# (a wheel versioned 0.5.23 imitates SGLang 0.5.23).
sglang_overrides = {
    "engine.package": "sglang-sim",
    "engine.launcher": "sglang_sim.launch_server",
    "model.source": f"s3://{S3_BUCKET}/{MODEL_PREFIX}",
}
engine_find_links = _lab.wheels_url
# The gateway (smg by default) from the same wheelhouse, its dependencies from PyPI.
router_find_links = _lab.wheels_url

# The lab's S3 endpoint and its (throwaway) credentials.
s3_endpoint_url = _lab.s3_url
aws_access_key_id = S3_CREDENTIALS["aws_access_key_id"]
aws_secret_access_key = S3_CREDENTIALS["aws_secret_access_key"]

# Lab hosts may be rebooted by the driver stage (a B200 site decides this per inventory).
allow_reboot = True

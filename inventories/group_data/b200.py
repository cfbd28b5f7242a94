"""Group data for the B200 hosts of inventories/b200.py (a documented example).

Secrets are read from root-only files on the machine that runs pyinfra, never written here.
"""

from pathlib import Path

ssh_user = "root"

# The serving setup: a profile plus per-group overrides of any of its keys.
# A shipped profile by name (`sglang-fleet check NAME` shows it), or a path to your own.
sglang_profile = "qwen3.6-27b-mtp"
sglang_overrides = {
    "model": {"source": "s3://models/qwen3.6-27b"},
    "memory": {"max_mamba_cache_size": 240},
}

# Driver stage: NVIDIA's repository and the 580 branch.
nvidia_driver_branch = "580"
# Off: the deploy never reboots a host by itself. A new or changed driver is loaded only by a
# reboot, so with False the driver stage stops with "reboot needed: loaded X, installed Y" (and
# refuses a version change before installing anything); reboot the host yourself, or turn this
# on for a host that serves nothing yet (its first deploy) or in a maintenance window, e.g.
# `--data allow_reboot=True --limit b200-02`.
allow_reboot = False
engine_cuda = "13.0"

# Weights from S3 (boto3 on the host; credentials land in /etc/sglang/aws-credentials, 0600).
_secrets = Path("/etc/sglang-fleet")
s3_endpoint_url = None  # AWS itself; set for MinIO, Ceph or another S3-compatible store
if (_secrets / "aws-credentials").exists():
    _creds = dict(line.split("=", 1) for line in
                  (_secrets / "aws-credentials").read_text().split() if "=" in line)
    aws_access_key_id = _creds.get("aws_access_key_id")
    aws_secret_access_key = _creds.get("aws_secret_access_key")

# The keys, each from a root-only file on the operator's machine, never committed:
# sglang-api-key: what clients send (the profile's server.api_key_secret, and the router's);
# sglang-router-admin-key: the only key that changes the router's workers;
# sglang-admin-api-key: SGLang's admin endpoints, if the profile names server.admin_api_key_secret.
secrets = {name: (_secrets / name).read_text().strip()
           for name in ("sglang-api-key", "sglang-router-admin-key", "sglang-admin-api-key")
           if (_secrets / name).exists()}
# Optional: only these networks reach the servers and routers (the hosts themselves always do).
# sglang_allowed_clients = ["10.0.0.0/8"]

# Prometheus' targets (every server, router and DCGM exporter), written on this machine by each
# deploy; examples/prometheus/prometheus.yml reads this file, examples/grafana/ shows it.
# prometheus_file_sd = "/etc/prometheus/file_sd/sglang-fleet.json"

# Capacity report: how long would the job take at the measured speed?
job_estimate = "900000,1000"  # completions, output tokens each

"""Converge hosts into verified SGLang servers:

    pyinfra -y inventories/b200.py deploys/sglang.py

preflight → driver → engine → weights → service → gate. Preflight (the profile, its rendering
for the pinned release, SGLang's startup rules, nothing else holding a server's port) fails
before any host changes; every later stage changes only what differs, so running it again
changes nothing.
"""

from pyinfra.context import host, inventory

from sglang_fleet import fleet, hostdata, metrics_targets, preflight
from sglang_fleet.driver import install_driver
from sglang_fleet.engine import install_engine
from sglang_fleet.gate import run_gate
from sglang_fleet.gpucheck import require_gpu_health
from sglang_fleet.render import render_all
from sglang_fleet.service import install_service, require_free_ports
from sglang_fleet.weights import stage_weights

profile = hostdata.profile_for(host)
launches = render_all(profile)
preflight.require_host(profile, launches, host.name, host.data.get("gpu_count"))
require_free_ports(launches)
require_gpu_health()  # a GPU unfit to serve refuses the host before any change

# The fleet's Prometheus targets, on this machine, once a run (host data prometheus_file_sd).
if (host.data.get(metrics_targets.TARGETS_KEY)
        and host.name == fleet.serving_hosts(inventory)[0].name):
    metrics_targets.write_targets(inventory, str(host.data.get(metrics_targets.TARGETS_KEY)))

install_driver()
release = install_engine(profile)
weights = stage_weights(profile)
install_service(profile, launches, release, restart_if=weights)
run_gate(profile, launches)

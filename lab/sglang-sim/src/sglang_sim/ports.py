"""A free loopback port for a simulator, for the tests and the benches that start them (the
product's tests, the simulator's and bench/ share it).

    port = free_port()             # a test's: 10000-14999
    port = free_port(BENCHES)      # a bench's: 15000-19999
"""

from __future__ import annotations

import random
import socket

TESTS, BENCHES = range(10000, 15000), range(15000, 20000)


def free_port(ports: range = TESTS) -> int:
    """A TCP port of ``ports`` free now on the loopback. Both ranges sit below the kernel's
    ephemeral range (``ip_local_port_range``, 32768 on by default), so that no outgoing
    connection is given it while a server restarted on it is down, and below the product's
    ports (20000 on); tests and benches apart, so no test's server takes the port of a worker
    a bench's roll restarts."""
    while True:
        port = random.choice(ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port

"""Converge hosts into verified SGLang servers:

    pyinfra -y inventories/b200.py deploys/sglang.py

preflight → driver → engine → weights → service → gate. Preflight (the profile, its rendering
for the pinned release, SGLang's startup rules, nothing else holding a server's port) fails
before any host changes; every later stage changes only what differs, so running it again
changes nothing.
"""

from sglang_fleet import converge

converge.serve()

"""What several components run or import ON the hosts: standard library only (or the
dependencies of the venv that runs it), importing nothing from ``sglang_fleet`` outside this
folder (relative imports only). ``sglang_fleet.ops.host_programs`` uploads it whole with every
component's ``host/`` folder, whose programs import it by its name:

- ``capacity`` (over ``capacity_log`` and ``capacity_figures``): the capacity report from a
  server's startup log; ``readiness`` and ``eta`` read it;
- ``crash``: the cause of a server's death in its journal;
- ``progress``: the progress lines of long work;
- ``terminal``: a host's text made safe to print;
- ``prune_caches``: removes the per-version caches no release keeps, through descriptors;
- ``start_server``: starts SGLang with its keys in-process.
"""

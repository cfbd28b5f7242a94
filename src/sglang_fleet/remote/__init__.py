"""What several components run or import ON the hosts: standard library only (or the
dependencies of the venv that runs it), importing nothing from ``sglang_fleet`` outside this
folder (relative imports only). ``sglang_fleet.ops.host_programs`` uploads it whole with every
component's ``host/`` folder, whose programs import it by its name:

- ``capacity``: the capacity report from a server's startup log (used by the gate, and by
  ``sglang-fleet capacity`` on this machine), over ``capacity_log`` (the lines, rank by rank)
  and ``capacity_figures`` (the server's figures); ``readiness`` and ``eta`` read it;
- ``crash``: the cause of a server's death in its journal;
- ``progress``: the progress lines of long work (the weights' download, the warm-up);
- ``terminal``: a host's text (journal lines, a server's answers) made safe to print, its
  control characters shown as codes (used by the gate and the CLI);
- ``prune_caches``: removes the per-version caches no release keeps, through descriptors
  (system python, as root, in a tree the service user writes: the engine and the compiled
  kernels);
- ``start_server``: starts SGLang with its keys in-process (the release's python: the service
  and the warm-up).
"""

"""What runs ON the hosts: standard library only (or the dependencies of the venv that runs it),
importing nothing from ``sglang_fleet`` outside this package (relative imports only), because it
is uploaded alone. ``sglang_fleet.ops.host_programs`` puts it on a host as the package
``sglang_fleet_remote`` and runs each program with ``python -m``:

- ``check_server``: the gate's checks of a running server (system python); its steps are
  ``gate_unit`` (the unit and its journal), ``gate_http``, ``gate_smoke`` and ``gate_soak``;
- ``capacity``: the capacity report from a server's startup log (used by ``check_server``, and
  by ``sglang-fleet capacity`` on this machine), over ``capacity_log`` (the lines, rank by
  rank) and ``capacity_figures`` (the server's figures);
- ``download_model``: stages model weights onto the host's disk (the tools venv: boto3,
  huggingface_hub);
- ``progress``: the progress lines of long work (used by ``download_model`` and
  ``warm_caches``);
- ``terminal``: a host's text (journal lines, a server's answers) made safe to print, its
  control characters shown as codes (used by the gate, ``member_start`` and the CLI);
- ``prune_caches``: removes the per-version caches no release keeps, through descriptors (system
  python, as root, in a tree the service user writes);
- ``start_server``: starts SGLang with its keys in-process (the engine release's python);
- ``start_router``: starts sglang-router with its keys in-process (the router's venv);
- ``warm_caches``: fills a release's kernel caches before a restart (system python, as the
  service user);
- ``cache_copy``: packs and unpacks a host's compiled kernels (system python, as root), over
  ``cache_archive`` (what an archive may hold), ``cache_pack`` and ``cache_unpack``.

A program is uploaded with every module it imports (``host_programs.imports``), so a program
split in parts reaches the host whole.

    /usr/bin/env PYTHONPATH=/opt/sglang/tools/pythonpath python3 \\
        -m sglang_fleet_remote.check_server --unit sglang.service ...
"""

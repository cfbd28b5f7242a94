"""Commands whose output the operator sees while they run.

pyinfra prints a command's output only with ``-vv`` or, for a command that failed, all at once
at its end: a host staging 55 GB of weights says nothing for minutes. A ``LiveCommand``'s lines
are printed as they arrive (pyinfra's own ``print_output``, for this command alone):

    yield LiveCommand(f"{downloader} s3://models/q /var/lib/sglang/models/q")
    # [b200-01] weights: 12.34 GB of 55.56 GB (22%), 410 MB/s, about 1 min 45 s left

An operation that runs a program itself (the warm-up) passes ``print_output=True`` to
``ops.run`` instead.
"""

from __future__ import annotations

from pyinfra.api.arguments import ConnectorArguments
from pyinfra.api.command import StringCommand
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.connectors.util import CommandOutput


class LiveCommand(StringCommand):
    """A shell command whose output lines pyinfra prints as they come, not only at a failure's
    end (and, for a failure, not a second time)."""

    def execute(self, state: State, host: Host,
                connector_arguments: ConnectorArguments) -> tuple[bool, CommandOutput]:
        connector_arguments.update(self.connector_arguments)
        status, output = host.run_shell_command(self, print_output=True,
                                                print_input=state.print_input,
                                                **connector_arguments)
        # Every line is on the screen already: pyinfra prints a failed command's output again
        # (unless it prints every command's), which would repeat the whole progress.
        if not status and not state.print_output:
            return status, CommandOutput([])
        return status, output

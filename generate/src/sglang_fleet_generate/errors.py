"""The one error ``sglang-fleet generate`` reports as a message (exit 1), never a traceback.

    raise GenerateError("in.jsonl: cannot read the input: No such file or directory")
"""


class GenerateError(Exception):
    """Bad input, output or URL; the message names the source and the fix."""

"""Root-only files that hold secrets, written without their contents ever reaching pyinfra's
output (not even with ``--diff`` or ``-vvv``): compared by checksum, uploaded by a function.

    secret_file(name="AWS credentials", dest="/etc/sglang/aws-credentials", content=text)
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.facts import FactBase
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.files import Directory, File, FindFiles, Sha256File
from pyinfra.operations import files

from sglang_fleet import paths
from sglang_fleet.errors import InputError
from sglang_fleet.ops import Ops, privilege

# API keys: printable ASCII without spaces, quotes, ``$`` or backslashes, long enough that masking
# them in a server's output cannot hit ordinary text.
API_KEY = re.compile(r"[A-Za-z0-9!#%&()*+,./:;<=>?@\[\]^_{|}~-]{16,512}")
SECRET_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")  # what names a secret in host data
# A server environment file's key lines: a copy kept for later holds none, as a key rotated
# since is revoked (the last good release goes back with the keys in force).
KEY_LINE = f"^({paths.API_KEY_VAR}|{paths.ADMIN_API_KEY_VAR})="


def without_keys(path: str) -> str:
    """The command that prints the environment file ``path`` without its key lines."""
    return f"sed -E {shlex.quote(f'/{KEY_LINE}/d')} {shlex.quote(path)}"


def keys_of(path: str) -> str:
    """The command that prints the key lines of the environment file ``path`` (none: nothing)."""
    return f"sed -nE {shlex.quote(f'/{KEY_LINE}/p')} {shlex.quote(path)}"


class KeylessSha256(FactBase[str | None]):
    """The SHA-256 of an environment file without its key lines (None: no such file), to
    compare with a kept copy (``without_keys``) without reading a key."""

    def command(self, path: str) -> str:
        return f"test ! -f {shlex.quote(path)} || {without_keys(path)} | sha256sum"

    def process(self, output: list[str]) -> str | None:
        return output[0].split()[0] if output else None


def api_key(value: object, source: str, name: str) -> str:
    """``value`` if it has the form of an API key, else an InputError naming ``secrets.NAME``."""
    if isinstance(value, str) and API_KEY.fullmatch(value):
        return value
    raise InputError.one(source, f"secrets.{name}", "must be 16 to 512 printable ASCII characters "
                         "without spaces, quotes, $ or backslashes",
                         "generate one: python3 -c 'import secrets; "
                         "print(secrets.token_urlsafe(32))'")


def secrets_directory() -> None:
    """The root-only directory the secret files go in (a stage calls it before writing one)."""
    files.directory(name="Secrets directory", path=paths.SECRETS, user="root", group="root",
                    mode="700")


def write_secret(state: Any, host: Any, dest: str, content: str,
                 privilege: dict[str, Any]) -> None:
    """Write ``content`` to ``dest`` through the command's standard input, as root: never in a
    temporary file another user could read, never on a command line (``secret_file``'s upload;
    the warm-up's, for keys it uses at once)."""
    tmp = shlex.quote(f"{dest}.sglang-fleet-new")
    command = (f"umask 077 && cat > {tmp} && chown root:root {tmp} && chmod 600 {tmp} && "
               f"mv -f {tmp} {shlex.quote(dest)}")
    ok, _ = host.run_shell_command(command, _stdin=content, **privilege)
    if not ok:
        raise OSError(f"could not write {dest}")


@operation(is_idempotent=True)
def secrets_absent() -> Ops:
    """Remove every file under the secrets directory (keys, credentials, environment files,
    last-good copies, orphans included), naming each.

        secrets_absent(name="Every secret file")
    """
    found = host.get_fact(FindFiles, path=paths.SECRETS, quote_path=True) or []
    if not found and not host.get_fact(Directory, path=paths.SECRETS):
        host.noop(f"{paths.SECRETS} is absent")
        return
    for path in sorted(found):
        logger.info(f"{host.print_prefix}removing secret file {path}")
    yield f"rm -rf {paths.SECRETS}"


@operation(is_idempotent=True)
def secret_file(dest: str, content: str) -> Ops:
    """Ensure ``dest`` holds ``content`` (a newline added when missing), owned by root with
    mode 0600; the content goes through the command's standard input, never a temporary file
    or a command line.

        secret_file(name="AWS credentials", dest="/etc/sglang/aws-credentials", content=text)
    """
    if not content.endswith("\n"):  # what goes through stdin ends with a newline
        content += "\n"
    current = host.get_fact(Sha256File, path=dest)
    if current != hashlib.sha256(content.encode()).hexdigest():
        yield FunctionCommand(write_secret, (dest, content, privilege()), {})
        return
    stat = host.get_fact(File, path=dest)
    if stat and (stat["user"], stat["group"], stat["mode"]) == ("root", "root", 600):
        host.noop(f"{dest} holds it already (root, 0600)")
    else:
        yield f"chown root:root {shlex.quote(dest)} && chmod 600 {shlex.quote(dest)}"

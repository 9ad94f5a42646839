"""Where a host's Aqua coordinator listens: `<state_dir>/aqua.sock`, or, when that path is too long
for an AF_UNIX address, a socket in a short private runtime directory (`coordinator_socket`)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import sys
import tempfile

log = logging.getLogger("gpu_agent.aqua")

# The longest path an AF_UNIX socket can bind: sun_path less its terminating NUL (108 bytes on
# Linux, 104 on macOS and the BSDs).
UNIX_PATH_MAX = 107 if sys.platform.startswith("linux") else 103
AQUA_SOCKET = "aqua.sock"  # the coordinator's socket, in the state dir when its path fits


def coordinator_socket(state_dir: str) -> tuple[str, bool]:
    """Where the coordinator of the agent whose state dir is `state_dir` listens.

    `<state_dir>/aqua.sock` when that path fits in an AF_UNIX address (`UNIX_PATH_MAX` bytes).
    Otherwise `<runtime>/gpu-agent-<uid>/aqua-<hash>.sock`, `<runtime>` being `$XDG_RUNTIME_DIR`
    if it is set and usable, else the system temp dir, and `<hash>` the first 12 hex digits of
    sha256(realpath(state_dir)): the same state dir always gets the same socket, another state dir
    another one. The `gpu-agent-<uid>` directory is the user's own, mode 0700 (`private_dir`), so
    no other user can reach the socket in the shared temp dir, not even in the moment between its
    bind and its chmod to 0600 (CoordinatorServer); one warning names both paths. Should no
    runtime dir do, the long path is kept: the coordinator then fails to start (logged, retried)
    and engines run without lending.

    Returns:
        (path, private): private says the path's directory must be made with `private_dir`.
    """
    wanted = os.path.join(state_dir, AQUA_SOCKET)
    if len(os.fsencode(wanted)) <= UNIX_PATH_MAX:
        return wanted, False
    digest = hashlib.sha256(os.fsencode(os.path.realpath(state_dir))).hexdigest()[:12]
    tried: list[str] = []
    for base in dict.fromkeys([os.environ.get("XDG_RUNTIME_DIR", ""), tempfile.gettempdir(), "/tmp"]):
        if not os.path.isabs(base):  # unset, empty or relative (the XDG spec says to ignore it)
            continue
        path = os.path.join(base, f"gpu-agent-{os.geteuid()}", f"aqua-{digest}.sock")
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            tried.append(f"{path!r} is too long")
            continue
        try:
            private_dir(os.path.dirname(path))
        except OSError as exc:
            tried.append(str(exc))
            continue
        log.warning(
            "The Aqua socket path %r is %d bytes, over the %d-byte limit of Unix socket paths: the"
            " coordinator listens on %r instead.",
            wanted,
            len(os.fsencode(wanted)),
            UNIX_PATH_MAX,
            path,
        )
        return path, True
    log.error(
        "The Aqua socket path %r is over the %d-byte limit of Unix socket paths and no runtime"
        " directory will do (%s): engines run without memory lending; use a shorter state dir.",
        wanted,
        UNIX_PATH_MAX,
        "; ".join(tried),
    )
    return wanted, False


def private_dir(path: str) -> None:
    """Make `path` a directory only this user can enter (mode 0700), or check that it is one.

    It lives in a directory every user may write (/tmp), so one that is already there may have been
    put there by another user: it must be a real directory (not a symlink), this user's, and closed
    to others, else OSError.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}, open to other users, not 700")

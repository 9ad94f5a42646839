"""`CoordinatorServer`: the `Coordinator` state machine behind a Unix domain socket.

One asyncio event loop serves every connection and calls the coordinator synchronously, so each
operation is atomic with respect to all others. Each connection is one *session*; when it closes
(the client exited, crashed or was killed) the coordinator's disconnect rule runs for it.

Seams for the host agent, which runs the server in-process:
    server = CoordinatorServer("/run/aqua.sock")
    server.start()            # background thread; returns once the socket accepts connections
    ... server.coordinator.stats() is NOT thread-safe: use server.call(fn) instead ...
    server.stop()             # False if its loop is hung: the connections are then hung up by force
or `server.serve_forever()` (blocks; stop() from another thread or a signal ends it), or
`await server.serve()` inside an existing event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from serving.aqua.coordinator.coordinator import Coordinator
from serving.aqua.coordinator.errors import CoordinatorError, InvalidArgument, ProtocolError
from serving.aqua.coordinator.protocol import MAX_FRAME, OPS, decode, encode
from serving.aqua.memory.shm_names import sweep_stale_segments

log = logging.getLogger(__name__)
T = TypeVar("T")
# At stop, how long connections may take to flush their last replies before they are cut (well
# under the host agent's 2 s stop timeout).
FLUSH_GRACE_S = 0.5
# The longest the check for a live server on the socket path may take.
PROBE_TIMEOUT_S = 1.0


class CoordinatorServer:
    """Serve a `Coordinator` on `socket_path` (created with mode `socket_mode`, default 0600)."""

    def __init__(
        self, socket_path: str, coordinator: Coordinator | None = None, *, socket_mode: int = 0o600
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.coordinator = coordinator if coordinator is not None else Coordinator()
        self.socket_mode = socket_mode
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._next_session = 1
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._socket_file: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound
        self.sessions: dict[str, dict[str, Any]] = {}  # session -> {"name", "pid"} from hello

    # ----------------------------------------------------------------- lifecycle
    async def serve(self) -> None:
        """Listen until `stop()`; then close every connection (running their disconnect rule)."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        _claim_socket_path(self.socket_path)
        # Segments of producers killed with their process group, which no one else unlinks.
        sweep_stale_segments()
        server = await asyncio.start_unix_server(self._handle, path=self.socket_path, limit=MAX_FRAME)
        st = os.stat(self.socket_path)
        self._socket_file = (st.st_dev, st.st_ino)
        os.chmod(self.socket_path, self.socket_mode)
        self._ready.set()
        log.info("aqua coordinator listening on %s", self.socket_path)
        try:
            async with server:
                await self._stopping.wait()
                server.close()
                for writer in list(self._writers):
                    writer.close()  # each handler sees EOF and runs its session's disconnect
                if self._handlers:
                    _, pending = await asyncio.wait(set(self._handlers), timeout=FLUSH_GRACE_S)
                    if pending:  # closing waits to flush: a peer that never reads would hold it
                        for writer in list(self._writers):
                            writer.transport.abort()
                        await asyncio.wait(pending, timeout=5.0)
        finally:
            server.close()
            self._unlink_socket_file()

    def _unlink_socket_file(self) -> None:
        """Remove our socket file, but not one a newer server bound on the same path meanwhile (a
        hung server given up on, and replaced, by the host agent may wake up and end much later)."""
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(self.socket_path)
            if (st.st_dev, st.st_ino) == self._socket_file:
                os.unlink(self.socket_path)

    def serve_forever(self) -> None:
        """Run the server in the calling thread until `stop()` is called."""
        try:
            asyncio.run(self.serve())
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._ready.set()

    def start(self, timeout: float = 10.0) -> None:
        """Run the server in a daemon thread; return once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        self._thread = threading.Thread(target=self._run_quietly, name="aqua-coordinator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"coordinator did not start on {self.socket_path} within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"coordinator failed to start: {self._error}") from self._error

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop serving (thread-safe, idempotent) and wait for a `start()`ed thread to end.

        Returns whether it ended within `timeout`. If not, its loop is stuck (it cannot close the
        connections itself), so every connection is shut down from here: each client sees its
        session end at once instead of waiting for replies that will never come.
        """
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop may have just closed
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if not self._thread.is_alive():
            return True
        log.error(
            "aqua coordinator on %s did not stop within %.1fs; hanging up its clients",
            self.socket_path,
            timeout,
        )
        self._hang_up()
        return False

    def _hang_up(self) -> None:
        """Shut down every connection's socket from outside the (stuck) loop. `shutdown` keeps the
        descriptors, which the loop still owns: the peers see end-of-file, nothing is closed under
        the loop."""
        for writer in list(self._writers):  # one C-level copy: atomic under the GIL
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def call(self, fn: Callable[[Coordinator], T], timeout: float = 10.0) -> T:
        """Run `fn(coordinator)` on the server's loop (atomic with the operations); from another thread."""
        if self._loop is None:
            raise RuntimeError("server is not running")

        async def run() -> T:
            return fn(self.coordinator)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def _run_quietly(self) -> None:
        with contextlib.suppress(BaseException):
            self.serve_forever()

    # ----------------------------------------------------------------- connections
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = f"s{self._next_session}"
        self._next_session += 1
        self.sessions[session] = {"name": None, "pid": None}
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self._writers.add(writer)
        try:
            while True:
                line = await _read_frame(reader)
                if line is None:  # skipped: the session goes on, as after any bad frame
                    reply = _error_reply(None, ProtocolError(f"frame exceeds the {MAX_FRAME}-byte limit"))
                    writer.write(encode(reply))
                elif not line:
                    break
                else:
                    writer.write(self._reply(session, line))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.coordinator.disconnect(session)
            del self.sessions[session]
            self._writers.discard(writer)
            writer.close()
            if task is not None:
                self._handlers.discard(task)

    def _reply(self, session: str, line: bytes) -> bytes:
        """The encoded reply to one request line.

        A reply that cannot be sent (over `MAX_FRAME`: stats of thousands of regions, a request id
        near the frame limit) is answered by a ProtocolError: raising here would end the session,
        freeing its allocations, over an answer to one request.
        """
        reply = self._dispatch(session, line)
        try:
            return encode(reply)
        except _UNSENDABLE as exc:
            error = ProtocolError(f"the reply could not be sent: {exc}")
        log.warning("aqua coordinator: session %s: %s", session, error)
        try:
            return encode(_error_reply(reply.get("id"), error))
        except _UNSENDABLE:  # the request's id itself is what cannot be sent back
            return encode(_error_reply(None, error))

    def _dispatch(self, session: str, line: bytes) -> dict[str, Any]:
        req_id = None
        try:
            frame = decode(line)
            req_id = frame.get("id")
            op, args = frame.get("op"), frame.get("args", {})
            if not isinstance(op, str) or op not in OPS:
                raise InvalidArgument(f"unknown operation {op!r}")
            if not isinstance(args, dict) or not set(args) <= OPS[op]:
                extra = sorted(set(args) - OPS[op]) if isinstance(args, dict) else args
                raise InvalidArgument(f"{op}: unexpected arguments {extra!r}")
            return {"id": req_id, "ok": True, "result": self._apply(session, op, args)}
        except CoordinatorError as exc:
            return _error_reply(req_id, exc)
        except (TypeError, KeyError) as exc:
            return _error_reply(req_id, InvalidArgument(f"bad arguments: {exc}"))

    def _apply(self, session: str, op: str, args: dict[str, Any]) -> Any:
        c = self.coordinator
        if op == "hello":
            self.sessions[session] = {"name": args.get("name"), "pid": args.get("pid")}
            return {"session": session}
        if op == "ping":
            return "pong"
        if op == "lease":
            return c.lease(**args, session=session)
        if op == "resize":
            return c.resize(**args, session=session)
        if op == "unlease":
            return c.unlease(**args, session=session)
        if op == "request_reclaim":
            return c.request_reclaim(**args, session=session)
        if op == "reclaim_status":
            return c.reclaim_status(**args)
        if op == "allocate":
            alloc = c.allocate(**args, session=session)
            return None if alloc is None else alloc.to_dict()
        if op == "free":
            return c.free(**args, session=session)
        if op == "pending_reclaims":
            return [a.to_dict() for a in c.pending_reclaims(**args)]
        if op == "allocation":
            return c.allocation(**args).to_dict()
        if op == "stats":
            return {**c.stats(), "sessions": len(self.sessions)}
        raise InvalidArgument(f"unknown operation {op!r}")  # unreachable: OPS is checked first


# What encoding a reply raises when it cannot be sent: over MAX_FRAME (ProtocolError), an int of
# more than 4300 digits (ValueError), nested deeper than the recursion limit (RecursionError).
_UNSENDABLE = (ProtocolError, ValueError, RecursionError)


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's line (b"" at end of stream), or None for one over `MAX_FRAME` bytes, which
    is read through its newline and dropped: ending the connection over it would end the session,
    freeing its allocations and withdrawing its leases, over one bad request."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:  # end of stream, perhaps after an unended frame
        return exc.partial
    except asyncio.LimitOverrunError:
        pass
    while True:
        try:
            await reader.readuntil(b"\n")
            return None
        except asyncio.LimitOverrunError as exc:  # left in the buffer: drop what it says is checked
            await reader.readexactly(exc.consumed)
        except asyncio.IncompleteReadError:
            return b""


def _error_reply(req_id: object, exc: CoordinatorError) -> dict[str, Any]:
    return {"id": req_id, "ok": False, "error": {"code": exc.code, "message": str(exc)}}


def _claim_socket_path(path: str) -> None:
    """Remove a stale socket file left by a dead server; refuse if a live server or a file is there."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Not blocking: a blocking connect to a listener whose backlog is full (a hung server that
    # accepts nothing) would hold this thread for ever; with a timeout it fails at once (EAGAIN).
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(path)
    except (BlockingIOError, TimeoutError):
        raise FileExistsError(f"a coordinator is already listening on {path} (not accepting)") from None
    except OSError:
        os.unlink(path)  # nobody listening: a leftover
    else:
        raise FileExistsError(f"a coordinator is already listening on {path}")
    finally:
        probe.close()

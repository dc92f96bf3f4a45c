"""Running the application: the listening socket (bound before the model loads, so a port in use
or a wrong host is one line at once), uvicorn with the HTTP guard, and the exit status.

SIGTERM and Ctrl-C stop accepting connections, let open requests finish for HttpLimits.drain_s,
stop the engine thread and exit 0 (uvicorn itself re-raises the signal after its shutdown, which
ends the process *by* the signal). An engine that cannot run shuts the server down the same way
and exits 1 with the reason."""

from __future__ import annotations

import errno
import signal
import socket
import threading
from contextlib import contextmanager

import uvicorn

from pagesim.serve.http_guard import guarded_protocol
from pagesim.serve.limits import HttpLimits


class AddressError(ValueError):
    """The host or port cannot be listened on; the message names the flag."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening (port 0: a free one)."""
    if not 0 <= port <= 65535:
        raise AddressError(f"--port must be in 0..65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise AddressError(f"--host {host!r}: not an address or a name this machine resolves ({e})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise AddressError(f"--port {port}: address {host}:{port} is already in use (another server?); "
                               "pick another port, or 0 for any free one") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise AddressError(f"--host {host}: not an address of this machine") from None
        if e.errno == errno.EACCES:
            raise AddressError(f"--port {port}: permission denied (ports below 1024 need privileges)") from None
        raise AddressError(f"--host {host} --port {port}: cannot listen ({e.strerror})") from None
    return sock


class _Uvicorn(uvicorn.Server):
    @contextmanager
    def capture_signals(self):
        """uvicorn's, without re-raising the signal at the end: a signal asks the server to stop,
        and the exit status is the server's own."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def guarded_server(app, limits: HttpLimits, log_level: str) -> uvicorn.Server:
    """uvicorn serving `app` behind the HTTP guard, stopped by SIGTERM / Ctrl-C after draining
    (also what `pagesim route` runs)."""
    config = uvicorn.Config(app, http=guarded_protocol(limits), log_level=log_level, access_log=False,
                            timeout_keep_alive=limits.keep_alive_s, timeout_graceful_shutdown=limits.drain_s,
                            h11_max_incomplete_event_size=limits.max_header_bytes, lifespan="on")
    return _Uvicorn(config)


def serve(app, sock: socket.socket, limits: HttpLimits, log_level: str) -> tuple[int, str | None]:
    """Serve until a signal or an engine failure: (exit status, the reason when it is not 0)."""
    server = guarded_server(app, limits, log_level)
    loop = app.state.server.loop
    loop.on_fatal = lambda error: setattr(server, "should_exit", True)
    server.run(sockets=[sock])
    if loop.error is not None:
        return 1, f"the engine failed: {type(loop.error).__name__}: {loop.error}"
    if not server.started:
        return 1, "the server did not start (see the log above)"
    return 0, None

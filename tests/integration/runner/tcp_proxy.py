"""A loopback TCP proxy a test can kill mid-transfer (the S3 endpoint "dies" under the runner) and bring back on the
same port (a daemon that was down for a while), or slow down (a thin link: an upload that takes a while)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


class TcpProxy:
    """Forwards TCP to a target; ``kill()`` resets every connection and stops listening (new connections are refused,
    as by a stopped daemon); ``revive()`` listens again on the same port.

    :param target: ``(host, port)`` to forward to.
    :param host: the address to listen on (loopback by default; a Docker bridge's gateway for containers on it).
    """

    #: What the client sends goes on at most this many bytes per second, all connections together (None: no limit).
    rate: float | None = None

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self.host = host
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.alive = True
        self._throttle = threading.Lock()
        self._next_send = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def revive(self) -> None:
        """Listen again on the same port after :meth:`kill`."""
        assert not self.alive, "the proxy is running"
        self.listener = socket.create_server((self.host, self.port))
        with self.lock:
            self.sockets = []
        self.alive = True
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _accept(self) -> None:
        listener = self.listener
        while self.alive:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            with self.lock:
                if not self.alive or listener is not self.listener:  # accepted as it was killed: refuse it
                    _reset(client)
                    _reset(upstream)
                    return
                self.sockets += [client, upstream]
            for src, dst, throttled in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, throttled), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        try:
            while data := src.recv(16384 if throttled and self.rate else 65536):
                if throttled:
                    self._wait_turn(len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _wait_turn(self, nbytes: int) -> None:
        """Hold ``nbytes`` back until the shared rate allows them (one queue for every connection)."""
        rate = self.rate
        if not rate:
            return
        with self._throttle:
            now = time.monotonic()
            start = max(now, self._next_send)
            self._next_send = start + nbytes / rate
        time.sleep(max(0.0, start - now))

    def kill(self) -> None:
        with self.lock:
            self.alive = False
            # close() alone leaves a thread blocked in accept() accepting one more connection: shutdown wakes it
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            for sock in self.sockets:
                _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Close with RST, not FIN: the client sees "connection reset", as when an endpoint dies."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass

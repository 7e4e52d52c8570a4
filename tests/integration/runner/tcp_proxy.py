"""A loopback TCP proxy a test can kill mid-transfer (the S3 endpoint "dies" under the runner) and bring back on the
same port (a daemon that was down for a while)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class TcpProxy:
    """Forwards loopback TCP to a target; ``kill()`` resets every connection and stops listening (new connections
    are refused, as by a stopped daemon); ``revive()`` listens again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._accept, daemon=True).start()

    def revive(self) -> None:
        """Listen again on the same port after :meth:`kill`."""
        assert not self.alive, "the proxy is running"
        self.listener = socket.create_server(("127.0.0.1", self.port))
        with self.lock:
            self.sockets = []
        self.alive = True
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

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

"""A loopback TCP proxy in front of PostgreSQL that can lose a commit's reply.

It speaks just enough of the wire protocol to see which client message runs the append
function. With prepared statements the SQL text travels only in the Parse message; later
calls send Bind naming the statement. So the proxy remembers, per connection, the
statements whose text is an append call, and counts a Bind of one of them (or a simple
Query with the text) as one append. When the Nth append is seen the connection is armed:
it relays the request, withholds everything the server answers, and once the server says
ReadyForQuery with an idle transaction status (the append committed) it closes both
sides. The server has committed; the client never hears it.

``stall()`` stops relaying in both directions until ``resume()``, keeping every connection
open and accepting new ones: a path (or a server) that has stopped answering while TCP still
acknowledges, which neither keepalives nor ``tcp_user_timeout`` notice. ``cut()`` closes every
connection and refuses new ones until ``mend()``: a path that is down, whatever was sent on it
lost (a stalled path delivers what it held when it relays again).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_IO_TIMEOUT_S = 30.0
_HOLD_TIMEOUT_S = 10.0


def is_append_call(query: bytes) -> bool:
    """The recorder's append: ``SELECT <schema>.flowledger_events_append…(…)`` (DDL excluded)."""
    return b"_append" in query and query.lstrip()[:6].upper() == b"SELECT"


def _cstring(buffer: bytes, start: int) -> tuple[bytes, int]:
    end = buffer.index(b"\0", start)
    return buffer[start:end], end + 1


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: LosingProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = socket.create_connection(proxy.upstream, timeout=_IO_TIMEOUT_S)
        self.client.settimeout(_IO_TIMEOUT_S)
        # Messages are relayed one by one: without NODELAY, Nagle and delayed ACKs add ~20 ms a call.
        for sock in (self.client, self.server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.marked: set[bytes] = set()
        self.armed = threading.Event()
        self.closed = threading.Event()

    def run(self) -> None:
        to_client = threading.Thread(target=self._server_to_client, daemon=True, name="proxy-s2c")
        to_client.start()
        try:
            self._client_to_server()
        except (OSError, ValueError, struct.error):
            pass
        finally:
            if not self.armed.is_set():
                self.close()
            to_client.join(timeout=_HOLD_TIMEOUT_S + 1)
            self.close()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    # -- client to server --------------------------------------------------------------

    def _client_to_server(self) -> None:
        reader = _Reader(self.client)
        while True:  # untyped start-up packets
            head = reader.exactly(8)
            length, code = struct.unpack("!ii", head)
            body = reader.exactly(length - 8)
            self.proxy.wait_relaying()
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                self.client.sendall(b"N")  # no encryption through this proxy
                continue
            self.server.sendall(head + body)
            if code == _CANCEL_REQUEST:
                return
            break
        outgoing: list[bytes] = []
        while not self.closed.is_set():
            kind = reader.exactly(1)
            (length,) = struct.unpack("!i", reader.exactly(4))
            body = reader.exactly(length - 4)
            message = kind + struct.pack("!i", length) + body
            # Once armed, the rest of the request (Execute, Sync) still goes through.
            if self._counts_as_append(kind, body) and self.proxy.claim_drop():
                self.armed.set()
            outgoing.append(message)
            if kind == b"X":
                self.proxy.wait_relaying()
                self.server.sendall(b"".join(outgoing))
                return
            if not reader.buffer:  # relay what the client sent together in one write
                self.proxy.wait_relaying()
                self.server.sendall(b"".join(outgoing))
                outgoing.clear()

    def _counts_as_append(self, kind: bytes, body: bytes) -> bool:
        if kind == b"P":
            name, at = _cstring(body, 0)
            query, _ = _cstring(body, at)
            if is_append_call(query):
                self.marked.add(name)
            else:
                self.marked.discard(name)
            return False
        if kind == b"B":
            _portal, at = _cstring(body, 0)
            statement, _ = _cstring(body, at)
            return statement in self.marked
        if kind == b"Q":
            query, _ = _cstring(body, 0)
            return is_append_call(query)
        return False

    # -- server to client --------------------------------------------------------------

    def _server_to_client(self) -> None:
        reader = _Reader(self.server)
        withheld: list[bytes] = []
        relayed: list[bytes] = []
        try:
            while not self.closed.is_set():
                kind = reader.exactly(1)
                raw_length = reader.exactly(4)
                (length,) = struct.unpack("!i", raw_length)
                message = kind + raw_length + reader.exactly(length - 4)
                if not self.armed.is_set():
                    relayed.append(message)
                    if not reader.buffer:
                        self.proxy.wait_relaying()
                        self.client.sendall(b"".join(relayed))
                        relayed.clear()
                    continue
                if relayed:  # answers to earlier requests still reach the client
                    self.client.sendall(b"".join(relayed))
                    relayed.clear()
                withheld.append(message)
                if kind == b"Z" and message[5:6] == b"I":
                    # Committed and idle: the reply is lost on the way back.
                    self.proxy.note_dropped()
                    self.close()
                    return
                if kind == b"Z":  # inside an explicit transaction (or failed): wait for COMMIT
                    if message[5:6] == b"E":
                        self.armed.clear()
                        self.proxy.note_not_committed()
                    for held in withheld:
                        self.client.sendall(held)
                    withheld.clear()
        except (OSError, ValueError, struct.error):
            pass
        finally:
            self.close()


class _Reader:
    """Exact-length reads from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def exactly(self, size: int) -> bytes:
        if size < 0:
            raise ValueError("negative length")
        while len(self.buffer) < size:
            chunk = self.sock.recv(max(65536, size - len(self.buffer)))
            if not chunk:
                raise ConnectionError("peer closed")
            self.buffer += chunk
        out = bytes(self.buffer[:size])
        del self.buffer[:size]
        return out


class LosingProxy:
    """A proxy on a free loopback port; ``lose_reply_of(n)`` arms it for the nth append from now."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._countdown: list[int] = []
        self.appends_seen = 0
        self.dropped = 0
        self.not_committed = 0
        self._stopping = threading.Event()
        self._relaying = threading.Event()
        self._relaying.set()
        self._cut = threading.Event()
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="proxy-accept")
        self._acceptor.start()

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        head, _, tail = url.partition("@")
        _, _, rest = tail.partition("/")
        return f"{head}@127.0.0.1:{self.port}/{rest}"

    def lose_reply_of(self, *nths: int) -> None:
        """Lose the committed reply of the nth (1-based) append seen from now on, for each n."""
        with self._lock:
            self.appends_seen = 0
            self._countdown = sorted(nths)

    def stall(self) -> None:
        """Stop relaying, both ways, on every connection (and new ones): bytes are read and held."""
        self._relaying.clear()

    def resume(self) -> None:
        """Relay again, held bytes first."""
        self._relaying.set()

    def cut(self) -> None:
        """Close every connection, and each new one as soon as it is made, until ``mend``."""
        self._cut.set()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def mend(self) -> None:
        """Take connections again."""
        self._cut.clear()

    def wait_relaying(self) -> None:
        """Called before every relayed write: blocks while stalled (at most the I/O timeout)."""
        self._relaying.wait(timeout=_IO_TIMEOUT_S)

    def claim_drop(self) -> bool:
        """Called per append seen: True when this one's reply must be lost."""
        with self._lock:
            self.appends_seen += 1
            if self._countdown and self._countdown[0] == self.appends_seen:
                self._countdown.pop(0)
                return True
            return False

    def note_dropped(self) -> None:
        with self._lock:
            self.dropped += 1

    def note_not_committed(self) -> None:
        with self._lock:
            self.not_committed += 1

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                link = _Link(self, client)
            except OSError:
                client.close()
                continue
            thread = threading.Thread(target=link.run, daemon=True, name="proxy-link")
            with self._lock:
                self._links.append(link)
                self._threads.append(thread)
            thread.start()

    def close(self) -> None:
        """Stop accepting, end every link, join every thread (bounded)."""
        self._stopping.set()
        self._relaying.set()  # stalled relays go on, into closed sockets
        self._listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            links, threads = list(self._links), list(self._threads)
        for link in links:
            link.close()
        for thread in threads:
            thread.join(timeout=5)


@contextlib.contextmanager
def losing_proxy(upstream_host: str, upstream_port: int) -> Iterator[LosingProxy]:
    """A LosingProxy that is closed on exit."""
    proxy = LosingProxy(upstream_host, upstream_port)
    try:
        yield proxy
    finally:
        proxy.close()


__all__ = ["LosingProxy", "is_append_call", "losing_proxy"]

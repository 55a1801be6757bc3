"""A TCP proxy on loopback in one listener's path to Redis, which can stop forwarding
without closing a connection (a partition: packets dropped, nothing reset), then heal.

It runs an asyncio loop in a thread of its own. While partitioned it reads nothing and
writes nothing: each side's bytes wait in the kernel's buffers, the client's reads time
out as they would on a dead network path, and connections opened meanwhile are accepted
and left silent. Healed, whatever waited is forwarded and new connections reach Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class PartitionProxy:
    """``127.0.0.1:<port>`` forwarding to ``127.0.0.1:<upstream_port>``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="partition-proxy",
                                        daemon=True)

    def start(self) -> PartitionProxy:
        """Listen on a free loopback port (:attr:`port`)."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the partition proxy did not start")
        return self

    @property
    def url(self) -> str:
        """The ``redis://`` URL a listener uses to go through the proxy."""
        return f"redis://127.0.0.1:{self.port}"

    def partition(self) -> None:
        """Stop forwarding (connections stay open)."""
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        """Forward again."""
        self._loop.call_soon_threadsafe(self._open.set)

    def stop(self) -> None:
        """Close every connection and the port; end the thread."""
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open.set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _client(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._open.wait()
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                 self.upstream_port)
        except OSError:
            self._writers.discard(writer)
            writer.close()
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        for w in (writer, up_writer):
            self._writers.discard(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._open.wait()  # a partition that began during the read holds it
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()

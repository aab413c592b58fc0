"""A real `forge serve` app on the embedded tiny node, in a background thread with its own event
loop, on a free loopback port. Tests talk to it over HTTP like any client."""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from tests.installed import skip_module_unless_installed

skip_module_unless_installed("torch", "transformers")

REPO = Path(__file__).resolve().parents[2]


class ServedNode:
    def __init__(self, targets=("functions/classify.py",), node_path=None, **opts):
        from forge.config.load import load_node
        from forge.embedded import default_node_path
        from forge.functions.loader import load_function
        from forge.serve.app import ServeOptions

        self.loaded = load_node(node_path or default_node_path())
        self.specs = [load_function(str(REPO / t)) for t in targets]
        self.opts = ServeOptions(port=0, **opts)
        self.node = self.loop = self.stop = self.url = None
        self.error = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        from forge.node.local import LocalNode
        from forge.serve.app import serve_node

        async def main():
            self.loop = asyncio.get_running_loop()
            self.stop = asyncio.Event()
            self.node = LocalNode(self.loaded)
            await self.node.start()
            await serve_node(self.node, self.specs, self.opts, stop=self.stop)

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def start(self, tmp: Path) -> "ServedNode":
        self.opts.ready_file = str(tmp / "url")
        self._thread.start()
        deadline = time.monotonic() + 120
        while not (
            Path(self.opts.ready_file).exists() and Path(self.opts.ready_file).read_text().strip()
        ):
            assert self.error is None, self.error
            assert time.monotonic() < deadline, "forge serve did not come up"
            time.sleep(0.05)
        self.url = Path(self.opts.ready_file).read_text().strip()
        return self

    def call(self, fn, *args):
        """Run fn(*args) on the server's loop (for reading or driving the node directly)."""
        async def go():
            r = fn(*args)
            return await r if asyncio.iscoroutine(r) else r

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(60)

    def close(self) -> None:
        if self.loop is not None and self.stop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
        self._thread.join(60)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = ServedNode(targets=("functions/classify.py", "functions/summarize.py")).start(
        tmp_path_factory.mktemp("srv")
    )
    yield s
    s.close()


def books(url: str) -> dict:
    import httpx

    serve, stats = httpx.get(url + "/v1/serve").json(), httpx.get(url + "/v1/stats").json()
    return {"open_requests": serve["open_requests"], "pending": stats["broker"]["pending"],
            "in_flight": sum(e["in_flight"] for e in stats["engines"]),
            "kv_reserved": sum(e["kv_blocks_reserved"] for e in stats["engines"]),
            "gate_active": sum(g["active"] for g in serve["endpoints"].values())}


def wait_settled(url: str, limit_s: float = 20.0) -> dict:
    deadline = time.monotonic() + limit_s
    while True:
        b = books(url)
        if not any(b.values()) or time.monotonic() > deadline:
            return b
        time.sleep(0.1)

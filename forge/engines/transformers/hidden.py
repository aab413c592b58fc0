"""Final hidden states for want_hidden requests. The continuous-batching manager returns tokens
only, so these run as plain forward passes of the base model (no LM head, no cache) in one worker
thread: serialized, fed by a bounded queue, and delivered through another queue that the engine's
poll drains.

They share the model's weights with the generation loop, which runs its own forwards in its own
thread at the same time, but not the base model's config: transformers' forward writes
`config.is_causal` for the length of every call (`merge_with_config_defaults`, utils/generic.py) and
the loop passes `is_causal=False` with its own packed mask. A forward here that read the loop's
value attended bidirectionally, and one that restored it at the wrong moment left it False for every
later embed (issue 49: the same text, another vector). So this worker forwards a view of the base
model whose config is its own copy, and says `is_causal=True` itself."""
from __future__ import annotations

import copy
import queue
import threading
from typing import Callable, Optional

_STOP = object()


def own_config_view(base):
    """The same module (its submodules, parameters and buffers are shared, not copied) with a config
    object of its own, so the generation loop's per-call writes to the shared config never reach
    this thread's forwards, nor this thread's to the loop's."""
    view = copy.copy(base)
    view.config = copy.deepcopy(base.config)
    return view


class HiddenWorker:
    def __init__(self, model, device: str, pooling: str, maxsize: int):
        self._base = own_config_view(
            model.get_decoder() if hasattr(model, "get_decoder") else model.model
        )
        self._device = device
        self._pooling = pooling
        self.inbox: queue.Queue = queue.Queue(maxsize=maxsize)
        # bounded by the inbox: one answer per accepted job
        self.outbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="forge-hf-hidden", daemon=True)
        self._thread.start()

    def submit(self, key: str, prompt_ids: tuple[int, ...], cancelled: Callable[[], bool]) -> None:
        """Queue one prompt; raises queue.Full (the engine checks its capacity first, so it does not
        happen)."""
        self.inbox.put_nowait((key, prompt_ids, cancelled))

    def pending(self) -> int:
        return self.inbox.qsize()

    def _forward(self, prompt_ids: tuple[int, ...]) -> list[float]:
        import torch

        with torch.inference_mode():
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self._device)
            # [seq, hidden]
            states = self._base(input_ids=ids, use_cache=False, is_causal=True).last_hidden_state[0]
            pooled = states.mean(dim=0) if self._pooling == "mean" else states[-1]
            return pooled.float().cpu().tolist()

    def _run(self) -> None:
        while True:
            job = self.inbox.get()
            if job is _STOP:
                return
            key, prompt_ids, cancelled = job
            if cancelled():
                continue
            try:
                self.outbox.put((key, self._forward(prompt_ids), None))
            except Exception as exc:   # one bad forward fails its request, not the worker
                self.outbox.put((key, None, f"{type(exc).__name__}: {exc}"))

    def stop(self, timeout_s: float) -> bool:
        """Drop queued jobs, stop after the current one; True if the thread ended within
        timeout_s."""
        try:
            while True:
                self.inbox.get_nowait()
        except queue.Empty:
            pass
        try:
            self.inbox.put_nowait(_STOP)
        except queue.Full:  # pragma: no cover - the inbox was just drained
            pass
        self._thread.join(timeout=max(timeout_s, 0.0))
        return not self._thread.is_alive()

    def drain(self, limit: int) -> list[tuple[str, Optional[list[float]], Optional[str]]]:
        out = []
        while len(out) < limit:
            try:
                out.append(self.outbox.get_nowait())
            except queue.Empty:
                break
        return out

"""The master's side of the token handshake (`auth`): which connected Locust workers proved they hold the
run's token, and so may be given a share of it.

Anyone who reaches the master's port can connect as a worker. A worker says hello with its nonce, the master
answers with its own nonce and its proof over the worker's, and the worker proves the token back over the
master's nonce; only then is it trusted. A worker that fails is refused once (said once, then ignored).
Split from `master`, whose run only asks who is trusted. This module imports no locust: it is handed the
master's runner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from itlbench.load.locust import auth

log = logging.getLogger("itlbench.locust.master")


class Admission:
    """Registers the handshake's messages on `runner` and keeps who passed it."""

    def __init__(self, runner: Any, token: str, on_refused: Callable[[str], None] = lambda cid: None) -> None:
        self.runner, self.token, self.on_refused = runner, token, on_refused
        self.hello: dict[str, tuple[str, str]] = {}  # client id -> (its nonce, ours) until it proves the token
        self.trusted: dict[str, str] = {}  # client id -> its nonce: workers that proved the token
        self.refused: set[str] = set()
        runner.register_message(auth.MSG_HELLO, self._on_hello)
        runner.register_message(auth.MSG_PROOF, self._on_proof)

    def _on_hello(self, msg: Any, **kw: Any) -> None:
        d = msg.data if isinstance(msg.data, dict) else {}
        nonce, cid = d.get("nonce"), msg.node_id
        if not isinstance(nonce, str) or not 16 <= len(nonce) <= 128 or cid in self.trusted:
            return
        ours = auth.new_nonce()
        self.hello[cid] = (nonce, ours)
        self.runner.send_message(auth.MSG_CHALLENGE, {"nonce": ours, "mac": auth.master_proof(self.token, nonce, cid)},
                                 client_id=cid)

    def _on_proof(self, msg: Any, **kw: Any) -> None:
        cid = msg.node_id
        pending = self.hello.pop(cid, None)
        d = msg.data if isinstance(msg.data, dict) else {}
        if pending is not None and auth.verify(self.token, d.get("mac"), "worker", pending[1], cid):
            self.trusted[cid] = pending[0]
        elif cid not in self.refused:
            self.refused.add(cid)
            log.warning("worker %s does not hold this run's token: ignored", cid)
            self.on_refused(cid)

    def ready(self) -> list[Any]:
        """Connected workers that proved the token, in Locust's index order."""
        nodes = [c for c in self.runner.clients.ready if c.id in self.trusted]
        return sorted(nodes, key=lambda c: self.runner.get_worker_index(c.id))

    def strangers(self) -> int:
        """Workers that connected without proving the token (refused, or never answered the challenge)."""
        return len(self.refused | set(self.hello))

    def job_mac(self, client_id: str, k: int, n: int, payload: str) -> str:
        """The MAC a trusted worker checks its job against (bound to the nonce it said hello with)."""
        return auth.job_mac(self.token, self.trusted[client_id], client_id, k, n, payload)

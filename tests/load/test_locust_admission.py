"""The master's side of the token handshake, on a recording stand-in for Locust's master runner (the
handshake over real processes: test_locust_auth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from itlbench.load.locust import auth
from itlbench.load.locust.admission import Admission


@dataclass
class _Node:
    id: str


@dataclass
class _Clients:
    ready: list[_Node] = field(default_factory=list)


@dataclass
class _Msg:
    node_id: str
    data: Any


class _Runner:
    """What Admission asks of a Locust MasterRunner: handlers, messages out, the ready clients and their index."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}
        self.sent: list[tuple[str, dict[str, Any], str]] = []
        self.clients = _Clients()
        self.index: dict[str, int] = {}

    def register_message(self, kind: str, handler: Any) -> None:
        self.handlers[kind] = handler

    def send_message(self, kind: str, data: dict[str, Any], client_id: str) -> None:
        self.sent.append((kind, data, client_id))

    def get_worker_index(self, cid: str) -> int:
        return self.index[cid]

    def connect(self, cid: str, index: int) -> None:
        self.clients.ready.append(_Node(cid))
        self.index[cid] = index

    def say(self, kind: str, cid: str, data: Any) -> None:
        self.handlers[kind](_Msg(cid, data))


def _handshake(runner: _Runner, token: str, cid: str, worker_token: str) -> str:
    """A worker's side: hello, then its proof over the master's nonce with the token it holds; returns its nonce."""
    nonce = auth.new_nonce()
    runner.say(auth.MSG_HELLO, cid, {"nonce": nonce})
    kind, challenge, to = runner.sent[-1]
    assert (kind, to) == (auth.MSG_CHALLENGE, cid)
    assert auth.verify(token, challenge["mac"], "master", nonce, cid)  # the master proved the run's token
    runner.say(auth.MSG_PROOF, cid, {"mac": auth.worker_proof(worker_token, challenge["nonce"], cid)})
    return nonce


def test_only_workers_proving_the_token_are_ready_in_locust_order_and_a_stranger_is_said_once() -> None:
    token, runner, refused = auth.new_token(), _Runner(), []
    admission = Admission(runner, token, on_refused=refused.append)
    for cid, index in (("b_1", 1), ("a_0", 0), ("x_2", 2)):
        runner.connect(cid, index)
    _handshake(runner, token, "b_1", token)
    nonce = _handshake(runner, token, "a_0", token)
    _handshake(runner, token, "x_2", auth.new_token())  # another run's token
    runner.say(auth.MSG_PROOF, "x_2", {"mac": "forged"})  # tries again: ignored, not said twice
    assert [n.id for n in admission.ready()] == ["a_0", "b_1"]
    assert refused == ["x_2"] and admission.strangers() == 1
    mac = admission.job_mac("a_0", 0, 2, "{}")  # bound to the nonce the worker said hello with
    assert auth.verify(token, mac, "job", nonce, "a_0", "0", "2", "{}")


def test_a_hello_without_a_usable_nonce_gets_no_challenge_and_a_proof_without_a_hello_is_refused() -> None:
    token, runner, refused = auth.new_token(), _Runner(), []
    admission = Admission(runner, token, on_refused=refused.append)
    runner.connect("w_0", 0)
    for data in ({"nonce": "short"}, {"nonce": 7}, "not a dict", {"nonce": "n" * 129}):
        runner.say(auth.MSG_HELLO, "w_0", data)
    assert runner.sent == []
    runner.say(auth.MSG_PROOF, "w_0", {"mac": auth.worker_proof(token, "never-sent", "w_0")})
    assert admission.ready() == [] and refused == ["w_0"]

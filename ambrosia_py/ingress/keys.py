"""The idempotency key table, sans-IO: part of the immortal's replayed state.

It is the dispatcher's ingress hook (``binding/hooks.py``): the dispatcher hands it
every logged ingress impulse (``envelope.py``) and the outcome of every call it let run.
It lives in the dispatcher, beside the immortal's attributes, not among them, and is
checkpointed with them (``binding/checkpoint.py``, format 2): a table built by logged
input only, so replay rebuilds it exactly, and a checkpoint taken while calls wait keeps
the table as it was at its base state, the tail replaying the rest.

For every key it holds either the method of a call still running (an ``async``
handler awaiting other immortals) or the finished call's :class:`Outcome`: the bytes
the client gets, in the method's codec. A call whose key is known is not run again:
it gets the stored outcome, or waits for the running one.

Retention: finished calls are kept in the order they finished and dropped from the
oldest, past ``keep_count`` of them or once older than ``keep_ms`` by the table's
clock, which is the latest logged arrival time (``envelope.py``). Running calls are
never dropped. A retry after its key was dropped runs the call again: retention must
outlast the clients' retrying (``docs/ingress.md``, *Retention*).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Any

import attrs

from ..binding.hooks import KeyedCall, Steps
from ..wire import Payload, ReturnType
from .envelope import INGRESS_METHOD_ID, CallEnvelope, RetentionEnvelope, decode_impulse
from .frames import Outcome, OutcomeKind, Refusal, RefusalReason

__all__ = [
    "DEFAULT_KEEP_COUNT",
    "DEFAULT_KEEP_SECONDS",
    "Answer",
    "KeyTable",
    "Running",
    "describe_key",
]

DEFAULT_KEEP_COUNT = 100_000
DEFAULT_KEEP_SECONDS = 24 * 3600.0


class Running(enum.Enum):
    """The answer for a key whose call is still running: wait for its outcome."""

    RUNNING = "running"


@attrs.frozen
class Answer:
    """What the clients waiting on ``key`` (for ``method_id``) get."""

    key: bytes
    method_id: int
    answer: Outcome | Refusal


# A finished call: (method id, the table's clock when it finished, outcome kind, value).
# Plain tuples, not objects: a table of 100,000 of them pickles in tens of milliseconds
# (attrs instances took seconds), and every checkpoint pickles it.
_Done = tuple[int, int, int, bytes]
_STATE_LAYOUT = 1
_DESCRIBED_KEYS = 3  # keys of a batch named in its description


def describe_key(key: bytes) -> str:
    """A key for messages: its text if it is printable UTF-8, else its hex."""
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return key.hex()
    return repr(text) if text.isprintable() else key.hex()


class KeyTable:
    """Outcomes by idempotency key (see the module docstring); the dispatcher's ingress
    hook (``binding/hooks.py``: :meth:`admit`, :meth:`complete`, :meth:`describe`)."""

    method_id = INGRESS_METHOD_ID  # the reserved id its calls are logged under

    def __init__(
        self,
        keep_count: int = DEFAULT_KEEP_COUNT,
        keep_ms: int = int(DEFAULT_KEEP_SECONDS * 1000),
    ) -> None:
        self.keep_count = keep_count
        self.keep_ms = keep_ms
        self.now_ms = 0
        self.dropped = 0  # finished calls dropped by retention, ever
        self._done: OrderedDict[bytes, _Done] = OrderedDict()
        self._running: dict[bytes, int] = {}

    @property
    def retention(self) -> RetentionEnvelope:
        return RetentionEnvelope(self.keep_count, self.keep_ms)

    @property
    def finished(self) -> int:
        return len(self._done)

    @property
    def running(self) -> int:
        return len(self._running)

    def configure(self, retention: RetentionEnvelope) -> None:
        self.keep_count = retention.keep_count
        self.keep_ms = retention.keep_ms
        self._drop_old()

    def admit(self, envelope: Payload) -> KeyedCall | Steps | Answer | None:
        """A logged ingress impulse (``envelope.py``), applied to the table: a call to
        run (its key was unknown and is now running), the :class:`Answer` for a known
        key, None (a retention setting, or a call already running: its outcome will
        answer), or for a BATCH one of these per call, in order (:class:`Steps`; a call
        with a key met earlier in the batch finds it running or finished, as it would
        in an impulse of its own). Raises :class:`IngressProtocolError` (a ValueError)
        for a malformed impulse: nothing of it is applied."""
        impulse = decode_impulse(envelope)
        if isinstance(impulse, RetentionEnvelope):
            self.configure(impulse)
            return None
        if len(impulse.calls) == 1:  # a CALL (or a batch of one)
            return self._admit_call(impulse.calls[0])
        steps = (self._admit_call(one) for one in impulse.calls)
        return Steps(tuple(step for step in steps if step is not None))

    def _admit_call(self, call: CallEnvelope) -> KeyedCall | Answer | None:
        found = self.begin(call.key, call.method_id, call.time_ms)
        if found is None:
            return KeyedCall(call.key, call.method_id, call.args)
        if found is Running.RUNNING:
            return None
        return Answer(call.key, call.method_id, found)

    def complete(self, call: KeyedCall, kind: ReturnType, value: bytes) -> Answer:
        """The call :meth:`admit` let run ended: its outcome is kept under its key, and
        is the answer for everyone waiting on it."""
        outcome = Outcome(OutcomeKind(kind), value)
        self.finish(call.key, call.method_id, outcome)
        return Answer(call.key, call.method_id, outcome)

    def describe(self, envelope: Payload) -> tuple[int | None, str]:
        """A logged ingress impulse in words: the method it calls, and its key (for a
        batch: the method if all its calls have one, and the keys, the first few)."""
        impulse = decode_impulse(envelope)
        if isinstance(impulse, RetentionEnvelope):
            return None, "ingress retention setting"
        calls = impulse.calls
        if len(calls) == 1:
            return calls[0].method_id, f"ingress call, key {describe_key(calls[0].key)}"
        methods = {one.method_id for one in calls}
        keys = ", ".join(describe_key(one.key) for one in calls[:_DESCRIBED_KEYS])
        more = len(calls) - _DESCRIBED_KEYS
        rest = f" and {more} more" if more > 0 else ""
        method = methods.pop() if len(methods) == 1 else None
        return method, f"ingress batch of {len(calls)} calls, keys {keys}{rest}"

    def lookup(self, key: bytes, method_id: int) -> Outcome | Refusal | Running | None:
        """What a call of ``method_id`` with ``key`` gets now, without running it: the
        stored outcome, RUNNING, a refusal (the key names another method's call), or
        None (unknown: run it). Reads only; :meth:`begin` is the logged step."""
        done = self._done.get(key)
        other = done[0] if done is not None else self._running.get(key)
        if other is None:
            return None
        if other != method_id:
            return Refusal(
                RefusalReason.KEY_REUSED,
                f"key {describe_key(key)} already names a call of method id {other}, "
                f"not {method_id}; nothing was run",
            )
        if done is None:
            return Running.RUNNING
        return Outcome(OutcomeKind(done[2]), done[3])

    def begin(self, key: bytes, method_id: int, time_ms: int) -> Outcome | Refusal | Running | None:
        """A logged call arrived at ``time_ms``: as :meth:`lookup`, and on None the call
        is now running (the caller runs it and reports with :meth:`finish`)."""
        if time_ms > self.now_ms:
            self.now_ms = time_ms
            self._drop_old()
        found = self.lookup(key, method_id)
        if found is None:
            self._running[key] = method_id
        return found

    def finish(self, key: bytes, method_id: int, outcome: Outcome) -> None:
        self._running.pop(key, None)
        self._done[key] = (method_id, self.now_ms, int(outcome.kind), outcome.value)
        self._drop_old()

    def _drop_old(self) -> None:
        done = self._done
        while done and self.keep_count and len(done) > self.keep_count:
            done.popitem(last=False)
            self.dropped += 1
        if self.keep_ms:
            cutoff = self.now_ms - self.keep_ms
            while done and next(iter(done.values()))[1] < cutoff:
                done.popitem(last=False)
                self.dropped += 1

    def __getstate__(self) -> tuple[object, ...]:
        # Flat: the finished calls as one list of tuples (in order), not an OrderedDict.
        # Checkpoints keep this: the first item numbers its layout.
        return (
            _STATE_LAYOUT,
            self.keep_count,
            self.keep_ms,
            self.now_ms,
            self.dropped,
            [(key, *done) for key, done in self._done.items()],
            self._running,
        )

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        if state[0] != _STATE_LAYOUT:
            raise ValueError(
                f"a key table in layout {state[0]!r}; this binding reads layout {_STATE_LAYOUT}"
            )
        _, self.keep_count, self.keep_ms, self.now_ms, self.dropped, done, self._running = state
        self._done = OrderedDict((entry[0], entry[1:]) for entry in done)

    def copy(self) -> KeyTable:
        """An independent copy (entries are immutable, so a shallow one)."""
        other = KeyTable(self.keep_count, self.keep_ms)
        other.now_ms = self.now_ms
        other.dropped = self.dropped
        other._done = OrderedDict(self._done)
        other._running = dict(self._running)
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyTable):
            return NotImplemented
        return (
            self.retention == other.retention
            and self.now_ms == other.now_ms
            and self._done == other._done  # OrderedDict: the order counts too
            and self._running == other._running
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"KeyTable({self.finished} finished, {self.running} running, keep "
            f"{self.keep_count} calls / {self.keep_ms} ms, clock {self.now_ms})"
        )

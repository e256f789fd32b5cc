"""The connector protocol's state machines as the seeds write them, and the project's
departures: the expected side of test_wallaroo_states.py, written independently of
``immortals/wallaroo/states.py`` (only its vocabulary, the enums, is shared).

The seeds' lines are quoted verbatim with their line numbers (seed 000 *Protocol State
Machine* and *Stream State Machine*, seed 001's *Protocol State Machine*) and parsed
here into tables; the project's departures are listed one by one, each with its reason
and the docs line that documents it. test_wallaroo_states.py checks that every quote is
in its seed and every departure in the docs, and then the module's tables against these.

How the quotes are read (``read_lists`` and ``seed_tables`` do exactly this):

- A heading ("In the <state> state ...", "The <state> state ...") opens a state; each
  ``- NAME: Sender -> Receiver (...)`` item under it admits frame NAME from Sender. A
  next state is the item's "next state = x" or "next state is x"; an item without one
  keeps the state (seed 000's streaming list names none for NOTIFY, MESSAGE, ACK, NACK).
- Names: NOFITY is the seeds' typo for NOTIFY (000:382, 001:62); MIGRATE_OK is the
  addendum's MIGRATION_ACK (001:20, 001:90); a MESSAGE flagged EOS is a MESSAGE, and a
  refusing NOTIFY_ACK a NOTIFY_ACK (the project's frame kinds split both); Wallaroo is
  the worker.
- The addendum restates the connection machine ("Each connection must follow the
  following state machine definition.", 001:25): its lists stand for the states it
  lists, seed 000's for ERROR and DISCONNECTED, which the addendum does not list.
- Stream machine prose: 000:409 gives every NOTIFY the next state OPEN (INTRO's item
  names none); 000:420 (under MESSAGE in the open state) moves a MESSAGE flagged EOS to
  CLOSED; 000:330 makes the message frames of a reset stream valid and ignored; 000:440
  makes NACKs a stack, each popped by a NOTIFY.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from immortals.wallaroo.states import ConnectionState, FrameKind, Role, StreamState

K = FrameKind
CS = ConnectionState
SS = StreamState
C, W = Role.CONNECTOR, Role.WORKER

# --- the seeds' lines, verbatim ------------------------------------------------------------

SEED_000_CONNECTION = [  # seed 000, Protocol State Machine
    (370, "In the connected state the following frame types are valid:"),
    (372, "- HELLO: Connector -> Worker (next state = handshake)"),
    (373, "- ERROR: * -> * (next state = error)"),
    (375, "In the handshake state the following frame types are valid:"),
    (377, "- OK: Worker -> Connector (next state = streaming)"),
    (378, "- ERROR: * -> * (next state = error)"),
    (380, "In the streaming state the following frame types are valid:"),
    (382, "- NOFITY: Connector -> Worker"),
    (383, "- MESSAGE: Connector -> Worker"),
    (384, "- ACK: Worker -> Connector"),
    (385, "- NACK: Worker -> Connector"),
    (386, "- ERROR: * -> * (next state = error)"),
    (388, "In the error state no frames are valid."),
    (390, "The disconnected state has no communication"),
]
SEED_001_CONNECTION = [  # seed 001, Protocol State Machine
    (48, "In the connected state the following frame types are valid:"),
    (50, "- HELLO: Connector -> Worker (next state = handshake)"),
    (51, "- ERROR: * -> * (next state = error)"),
    (52, "- MIGRATE: Worker -> Connector"),
    (54, "In the handshake state the following frame types are valid:"),
    (56, "- OK: Worker -> Connector (next state = streaming)"),
    (57, "- ERROR: * -> * (next state = error)"),
    (58, "- MIGRATE: Worker -> Connector (next state = migrating)"),
    (60, "In the streaming state the following frame types are valid:"),
    (62, "- NOFITY: Connector -> Worker"),
    (63, "- NOTIFY_ACK: Worker -> Connector"),
    (64, "- MESSAGE: Connector -> Worker"),
    (65, "- ACK: Worker -> Connector"),
    (66, "- RESTART: Worker -> Connector"),
    (67, "- ERROR: * -> * (next state = error)"),
    (68, "- MIGRATE: Worker -> Connector (next state = migrating)"),
    (70, "In the migrating state, the following frame types are valid:"),
    (71, "- MIGRATE_OK: Connector -> Worker (next state = connected)"),
    (72, "- ERROR: * -> * (next state = error)"),
]
SEED_000_STREAM = [  # seed 000, Stream State Machine
    (411, "In the intro state, the following actions are valid:"),
    (413, "- NOTIFY: Connector -> Worker (provide a stream id and a fully qualified name)"),
    (417, "In the open state, the following actions are valid:"),
    (419, "- MESSAGE: Connector -> Worker (production of stream data)"),
    (420, "* if the EOS flag is set the next state is closed"),
    (421, "- ACK: Worker -> Connector"),
    (423, "- NACK: Worker -> Connector (next state is reset)"),
    (425, "In the closed state, the following actions are valid:"),
    (427, "- NOTIFY: Connector -> Worker (next state is open)"),
    (429, "- NACK: Worker -> Connector (next state is reset)"),
    (431, "- ACK: Worker -> Connector"),
    (434, "In the reset state, the following actions are valid:"),
    (436, "- NOTIFY: Connector -> Worker (next state is open)"),
    (437, "- ACK: Worker -> Connector"),
]
SEED_PROSE = [  # the other lines the reading above rests on
    ("000", 409, "The state machine will always end up in the open state after a notification."),
    ("000", 330, "effectively causes all message frames to be ignored for that stream until a "
                 "new notify message is sent for that stream"),
    ("000", 440, "NACKs may be handled when in invalid states but they MUST be treated as if "
                 "there was a stack of NACKs. Each NACK will require a NOTIFY."),
    ("001", 20, "2. `MIGRATION_ACK`: Connector -> Wallaroo"),
    ("001", 25, "Each connection must follow the following state machine definition."),
    ("001", 90, "| 9 | send MIGRATION_ACK | - | Send this on old connection |"),
]  # fmt: skip

# --- reading them ---------------------------------------------------------------------------

KINDS_OF_NAME = {
    "HELLO": (K.HELLO,),
    "OK": (K.OK,),
    "ERROR": (K.ERROR,),
    "NOTIFY": (K.NOTIFY,),
    "NOFITY": (K.NOTIFY,),
    "NOTIFY_ACK": (K.NOTIFY_ACK, K.NOTIFY_REFUSED),
    "MESSAGE": (K.MESSAGE, K.MESSAGE_EOS),
    "ACK": (K.ACK,),
    "NACK": (K.NACK,),
    "RESTART": (K.RESTART,),
    "MIGRATE": (K.MIGRATE,),
    "MIGRATE_OK": (K.MIGRATION_ACK,),
}
PARTIES = {"Connector": {C}, "Worker": {W}, "Wallaroo": {W}, "*": {C, W}}
HEADING = re.compile(r"(?:In the|The) (\w+) state\b")
ITEM = re.compile(r"- (\w+): (\*|\w+) -> (\*|\w+)(?: \((.*)\))?")
NEXT = re.compile(r"next state (?:=|is) (\w+)")
EOS_NOTE = "* if the EOS flag is set the next state is closed"

Table = dict[Any, dict[FrameKind, Any]]


def read_lists(
    lines: list[tuple[int, str]], states: type[ConnectionState] | type[StreamState]
) -> tuple[Table, dict[FrameKind, set[Role]]]:
    """``state -> kind -> next state`` and ``kind -> senders`` as the quoted lines say."""
    table: Table = {}
    senders: dict[FrameKind, set[Role]] = {}
    state = None
    for _, text in lines:
        if heading := HEADING.match(text):
            state = states(heading.group(1))
            table[state] = {}
        elif text == EOS_NOTE:  # under MESSAGE: a MESSAGE flagged EOS
            table[state][K.MESSAGE_EOS] = SS.CLOSED
        else:
            item = ITEM.fullmatch(text)
            assert item and state is not None, text
            name, sender, receiver, note = item.groups()
            assert sender == "*" or PARTIES[sender] != PARTIES[receiver], text
            after = NEXT.search(note or "")
            for kind in KINDS_OF_NAME[name]:
                table[state][kind] = states(after.group(1)) if after else state
                assert senders.setdefault(kind, PARTIES[sender]) == PARTIES[sender], text
    return table, senders


def seed_tables() -> tuple[Table, Table, dict[FrameKind, set[Role]]]:
    """The connection table (the addendum's lists where it has them), the stream table
    (with 000:409 and 000:330 applied) and who sends each kind."""
    old, senders = read_lists(SEED_000_CONNECTION, ConnectionState)
    new, more = read_lists(SEED_001_CONNECTION, ConnectionState)
    stream, streams = read_lists(SEED_000_STREAM, StreamState)
    connection = {state: new.get(state, old.get(state, {})) for state in ConnectionState}
    for row in stream.values():
        if K.NOTIFY in row:
            row[K.NOTIFY] = SS.OPEN  # 000:409
    stream[SS.RESET] |= {K.MESSAGE: SS.RESET, K.MESSAGE_EOS: SS.RESET}  # 000:330
    for kinds in (more, streams):
        for kind, who in kinds.items():
            assert senders.setdefault(kind, who) == who, kind
    return connection, stream, senders


# --- the project's departures, one by one -----------------------------------------------------


class Departure(NamedTuple):
    machine: str
    state: ConnectionState | StreamState
    kind: FrameKind
    seed: ConnectionState | StreamState | None  # what the seeds give (None: not valid)
    ours: ConnectionState | StreamState | None  # what the project does (None: not valid)
    why: str
    doc: str  # docs/wallaroo.md or docs/protocols.md, verbatim (whitespace aside)


MIGRATING_DOC = (
    "MIGRATING admits what may cross the MIGRATE on the wire or what the migration needs: "
    "MESSAGE, its EOS, a NOTIFY sent before (refused), ACK, and MIGRATION_ACK"
)
EOS_DOC = "| end of stream | MESSAGE flagged EOS (a boundary if no payload is left) | EOS_MESSAGE |"
ANSWER_DOC = "NOTIFY is answered with NOTIFY_ACK in both dialects"
DEPARTURES = [
    Departure(
        "connection", CS.CONNECTED, K.MIGRATE, CS.CONNECTED, CS.MIGRATING,
        "001:52 names no next state, but the addendum's diagram has an arrow from "
        "Connected into Migrating, as from Handshake and Streaming",
        "MIGRATE moves CONNECTED, HANDSHAKE and STREAMING to MIGRATING (the addendum's diagram).",
    ),
    Departure(
        "connection", CS.STREAMING, K.NACK, None, CS.STREAMING,
        "the addendum's streaming list (001:62-68) drops seed 000's NACK (000:385); the draft "
        "keeps it: the addendum adds migration, and the stream machine still needs the NACK",
        "`draft` follows the seed (with the migration addendum: MIGRATE and MIGRATION_ACK)",
    ),
    Departure(
        "connection", CS.STREAMING, K.RESTART, CS.STREAMING, CS.DISCONNECTED,
        "001:66 names no next state; the released worker sends RESTART and closes",
        "RESTART moves STREAMING to DISCONNECTED: the released worker sends it and closes.",
    ),
    Departure(
        "connection", CS.STREAMING, K.EOS_MESSAGE, None, CS.STREAMING,
        "v3's EOS_MESSAGE (reference wallaroo.md; in no seed) is v3's MESSAGE flagged EOS",
        EOS_DOC,
    ),
    Departure(
        "connection", CS.MIGRATING, K.MIGRATION_ACK, CS.CONNECTED, CS.DISCONNECTED,
        "001:71's 'next state = connected' is the connector's new connection, already "
        "handshaken (steps 7-9); the worker closes the old one (step 10)",
        "MIGRATION_ACK, which moves the old connection to DISCONNECTED (the addendum's "
        '"next state = connected" is the connector\'s new connection; the worker closes the '
        "old one, step 10)",
    ),
    *(
        Departure("connection", CS.MIGRATING, kind, None, CS.MIGRATING, why, MIGRATING_DOC)
        for kind, why in [
            (K.MESSAGE, "sent before the MIGRATE arrived"),
            (K.MESSAGE_EOS, "the connector ends its streams with EOS (001 step 3)"),
            (K.NOTIFY, "sent before the MIGRATE arrived"),
            (K.NOTIFY_REFUSED, "the worker's answer to such a NOTIFY"),
            (K.ACK, "the worker ACKs the streams (001 step 6)"),
        ]
    ),
    Departure(
        "stream", SS.INTRO, K.ACK, None, SS.INTRO,
        "ACKs arrive asynchronously (000:432, 000:438): a late one may reach a stream "
        "released since, or one a NOTIFY_ACK refused",
        "An ACK may name a stream in any state (ACKs arrive asynchronously).",
    ),
    Departure(
        "stream", SS.OPEN, K.NOTIFY, None, SS.OPEN,
        "a reintroduction: 'always end up in the open state after a notification' (000:409)",
        "NOTIFY always leaves a stream OPEN",
    ),
    Departure(
        "stream", SS.OPEN, K.NOTIFY_ACK, None, SS.OPEN,
        "seed 000 has no NOTIFY_ACK (the addendum lists it per connection only); it answers "
        "a NOTIFY, which leaves the stream OPEN",
        ANSWER_DOC,
    ),
    Departure(
        "stream", SS.RESET, K.NOTIFY_ACK, None, SS.RESET,
        "the answer to a NOTIFY that popped a NACK but not the last one",
        ANSWER_DOC,
    ),
    Departure(
        "stream", SS.OPEN, K.NOTIFY_REFUSED, None, SS.INTRO,
        "a refusal says the stream is not open on this connection",
        "NOTIFY_ACK(false) moves it back to INTRO.",
    ),
    Departure(
        "stream", SS.CLOSED, K.NOTIFY_ACK, None, SS.CLOSED,
        "a draft connector does not wait for NOTIFY_ACK (seed 000 has none), so a short "
        "stream may have sent its EOS before the answer came",
        "NOTIFY_ACK may also meet a CLOSED stream (a draft connector does not wait for it, "
        "so a short stream may have sent its EOS first)",
    ),
    Departure(
        "stream", SS.CLOSED, K.NOTIFY_REFUSED, None, SS.INTRO,
        "the same answer, refusing: the stream is not open on this connection",
        "a refusal there moves it back to INTRO too.",
    ),
    Departure(
        "stream", SS.OPEN, K.EOS_MESSAGE, None, SS.CLOSED, "as a MESSAGE flagged EOS", EOS_DOC
    ),
    Departure(
        "stream", SS.RESET, K.EOS_MESSAGE, None, SS.RESET,
        "ignored in a reset stream, as a MESSAGE flagged EOS (000:330)",
        "MESSAGEs of a reset stream are valid and ignored.",
    ),
    Departure(
        "stream", SS.RESET, K.NACK, None, SS.RESET,
        "000:440: 'NACKs may be handled when in invalid states' as a stack; taken up in RESET "
        "(one more on the stack), not in INTRO (nothing to reset)",
        "NACKs stack: a NACK pushes one, a NOTIFY in RESET pops one and opens the stream only "
        "when none is left",
    ),
]  # fmt: skip
SENDER_DEPARTURES = {
    # v3's EOS_MESSAGE ends a stream the connector sends (reference wallaroo.md), as the
    # draft's MESSAGE flagged EOS does.
    K.EOS_MESSAGE: {C},
}


def expected_tables() -> tuple[Table, Table, dict[FrameKind, set[Role]]]:
    connection, stream, senders = seed_tables()
    tables = {"connection": connection, "stream": stream}
    for d in DEPARTURES:
        row = tables[d.machine][d.state]
        assert row.get(d.kind) is d.seed, d  # the departure says what the seed says
        if d.ours is None:
            del row[d.kind]
        else:
            row[d.kind] = d.ours
    for kind, who in SENDER_DEPARTURES.items():
        assert kind not in senders
        senders[kind] = who
    return connection, stream, senders


CONNECTION, STREAM, FROM = expected_tables()

"""Exactly-once links between coordinators.

``protocol`` is the sans-IO conversation (numbering, acknowledgements, resends),
``auth`` the secret handshake and frame tags, ``conn`` one connection's bytes and
timers, ``peers`` the asyncio side that dials and accepts them, ``config`` their
settings and the cluster secret.
"""

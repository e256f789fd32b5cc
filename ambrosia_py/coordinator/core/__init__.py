"""The coordinator itself: what it does with each record, and the process that runs it.

``intake`` turns the binding's and the links' bytes into records (sans-IO);
``server`` is the asyncio adapter that writes, syncs and forwards them, with ``commit``
(durability) and ``forwarding`` (delivery to the binding); ``checkpoint`` is the byte
format of the coordinator's checkpoint files; ``binding_link`` and ``binding_auth`` are
the two local sockets to the binding; ``config``, ``process`` and ``debug`` start it.
"""

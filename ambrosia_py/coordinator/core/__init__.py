"""The coordinator itself: what it does with each record, and the process that runs it.

``intake`` turns the binding's and the links' bytes into events and records (sans-IO,
the events in ``events``); ``server`` is the asyncio adapter around it (sockets,
start-up, recovery), ``committer`` takes each record to the log and commits
checkpoints, with ``commit`` (the group-commit pipeline) and ``forwarding`` (delivery to
the binding once durable); ``checkpoint`` is the byte
format of the coordinator's checkpoint files; ``binding_link`` and ``binding_auth`` are
the two local sockets to the binding; ``config``, ``process`` and ``debug`` start it.
"""

"""Which instances exist and where they listen: the registry and its checks.

``store`` is the registry itself, ``files`` opens it beside the instance directories it
describes, and ``port_users`` says which instance holds a port that could not be bound.
"""

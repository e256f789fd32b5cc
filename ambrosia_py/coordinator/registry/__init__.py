"""Which instances exist and where they listen: the registry and its checks.

``interface`` is what every registry offers, ``backends`` opens one from a spec (the
SQLite ``store``/``sqlite``, or ``etcd``), ``files`` opens it for a start beside the
instance directories it describes, ``publish`` says which host an address is published
with and keeps the ingress's published while it serves, and ``port_users`` says which
instance holds a port that could not be bound.
"""

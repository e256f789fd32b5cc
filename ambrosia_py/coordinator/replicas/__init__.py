"""The replicas of one instance at run time: the network between them (:mod:`.transport`)."""

from .transport import ReplicaTransport
from .transport_auth import ReplicaAuthError

__all__ = ["ReplicaAuthError", "ReplicaTransport"]

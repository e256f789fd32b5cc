"""An instance's files: logs, checkpoints, the lock, and the data directory that holds them.

``files`` writes and reads them, ``scan`` verifies a log, ``replay`` feeds the logged
records to a binding on recovery, ``index`` is the sidecar index readers use;
``data_dir``, ``ownership`` and ``modes`` keep the directory ours and private.
"""

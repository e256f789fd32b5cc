"""The language binding: Immortal, @rpc, proxies, deterministic dispatch, checkpoints."""

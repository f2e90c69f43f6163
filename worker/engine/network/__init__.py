"""A workspace's network: its namespace, its link to the host and the rules of its policy
(`network`); refusals recorded under `egress` (`netlog`); user-mode networking where the
worker is not root (`usernet`). The processes these start (the `allow` guard, the
nftables loader, the rootless tether) run as `python -I -S` and so live in
`bashfleet.worker.engine.isolate` (`netguard`, `nft_helper`, `usernet_tether`).
"""

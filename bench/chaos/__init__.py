"""``baton chaos``: fault injection on the real stack with a ledger of every request.

- :mod:`.ledger`: per-request verdicts and the invariants (pure, unit-tested).
- :mod:`.faults`: finding replica/engine processes and injecting SIGKILL/SIGSTOP, the LMCache Redis tier.
- :mod:`.victims`: the replica a fault hits, one whose engine's own metrics show it serving a request.
- :mod:`.attribution`: which recovery step in the request records answers which fault (pure, unit-tested).
- :mod:`.stack`: a P/D deployment of the tiny model on its own Ray head, a Baton gateway, a tenant and key.
- :mod:`.drill`: baseline, steady streaming load, seeded faults, the ledger and the Postgres checks.
"""

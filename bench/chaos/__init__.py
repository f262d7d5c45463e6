"""``baton chaos``: fault injection on the real stack with a ledger of every request.

- :mod:`.ledger`: per-request verdicts and the invariants (pure, unit-tested).
- :mod:`.faults`: finding replica/engine processes and injecting SIGKILL/SIGSTOP, the LMCache Redis tier.
- :mod:`.stack`: a P/D deployment of the tiny model on its own Ray head, a Baton gateway, a tenant and key.
- :mod:`.drill`: baseline, steady streaming load, seeded faults, the ledger and the Postgres checks.
"""

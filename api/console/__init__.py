"""The console: a self-service web UI for tenants and operators, served by Baton's API process.

``baton.api.console.router:router`` holds the JSON API (``/console/api``) and the built front end
(``/console/``, from ``web/dist``). The API process wires it from its composition
root (:mod:`baton.api.composition`).
"""

from __future__ import annotations

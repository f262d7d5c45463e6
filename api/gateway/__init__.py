"""The OpenAI-compatible gateway: ``/v1`` for tenants, with keys, limits, metering and the relay.

:func:`baton.api.gateway.build.build_gateway` wires the parts from settings; ``baton.api.app.create_app``
calls it in the app's lifespan, so nothing is created at import time.
"""

"""The operator's REST API, mounted at ``/admin/v1`` (``baton.api.admin.router:router``)."""

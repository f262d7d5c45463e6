"""``/admin/v1``: every admin route, behind admin credentials, answering errors as problem details."""

from fastapi import APIRouter

from . import access, deployments, flow, keys, limits, models, records, slo, tenants, users
from .problems import PROBLEM_RESPONSES, ProblemRoute

router = APIRouter(route_class=ProblemRoute, responses=PROBLEM_RESPONSES)
for module in (tenants, users, keys, limits, access, models, deployments, slo, records, flow):
    router.include_router(module.router)

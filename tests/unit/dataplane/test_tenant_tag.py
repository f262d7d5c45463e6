from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from baton.dataplane.kv_connector import TENANT_TAG_KEY, apply_tenant_tag, tenant_tag


def test_tag_is_a_stable_digest_that_hides_the_salt():
    assert tenant_tag("salt-a") == tenant_tag("salt-a")
    assert tenant_tag("salt-a") != tenant_tag("salt-b")
    assert "salt" not in tenant_tag("salt-a")
    assert tenant_tag("a@b/c").isalnum()


def test_tag_goes_where_lmcache_reads_request_configs():
    from lmcache.integration.vllm.utils import extract_request_configs_from_sampling_params

    params = SimpleNamespace(extra_args=None)
    apply_tenant_tag(params, "salt-a")
    assert extract_request_configs_from_sampling_params(params) == {TENANT_TAG_KEY: tenant_tag("salt-a")}

    # NIXL's transfer params in the same dict are kept.
    params = SimpleNamespace(extra_args={"kv_transfer_params": {"do_remote_prefill": True}})
    apply_tenant_tag(params, "salt-b")
    assert params.extra_args["kv_transfer_params"] == {"do_remote_prefill": True, TENANT_TAG_KEY: tenant_tag("salt-b")}


def test_no_salt_no_tag():
    params = SimpleNamespace(extra_args=None)
    apply_tenant_tag(params, None)
    assert params.extra_args is None

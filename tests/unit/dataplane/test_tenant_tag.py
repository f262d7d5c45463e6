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


def _request(params, salt="salt-a"):
    return SimpleNamespace(request_id="r1", cache_salt=salt, kv_transfer_params=params,
                           sampling_params=SimpleNamespace(extra_args={"kv_transfer_params": params}))


def test_the_decode_side_of_a_handoff_is_not_looked_up_in_the_tiers_nor_stored_again(monkeypatch):
    from lmcache.integration.vllm.utils import extract_request_configs_from_sampling_params
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

    from baton.dataplane.kv_connector import SKIP_STORE_KEY, BatonLMCacheConnectorV1

    looked_up = []
    monkeypatch.setattr(LMCacheConnectorV1, "get_num_new_matched_tokens",
                        lambda self, request, n: looked_up.append(request.request_id) or (256, False))
    connector = object.__new__(BatonLMCacheConnectorV1)

    # P/D decode side: NIXL hands the prompt's KV over.
    handed = _request({"do_remote_prefill": True, "remote_engine_id": "p0"})
    assert connector.get_num_new_matched_tokens(handed, 0) == (0, False)
    assert looked_up == []
    configs = extract_request_configs_from_sampling_params(handed.sampling_params)
    assert configs == {SKIP_STORE_KEY: True, TENANT_TAG_KEY: tenant_tag("salt-a")}

    # Anything else (aggregated, the prefill side, a resumed stream) is looked up and stored as before.
    for params in ({}, {"do_remote_decode": True}, {"do_remote_prefill": False}):
        request = _request(dict(params))
        assert connector.get_num_new_matched_tokens(request, 0) == (256, False)
        assert SKIP_STORE_KEY not in extract_request_configs_from_sampling_params(request.sampling_params)
    assert len(looked_up) == 3

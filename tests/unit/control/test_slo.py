"""SLO compilation: per-pool autoscaling targets and the gateway's admission."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from baton.control import slo


@dataclass
class Policy:
    name: str
    ttft_ms: int
    tpot_ms: int
    priority: int = 0
    sheddable: bool = False
    weight: float = 1.0


TP = slo.EngineThroughput(prefill_tokens_per_s=10_000, decode_step_ms=5, decode_ms_per_seq=0.5,
                          mean_prompt_tokens=1000, max_num_seqs=64)


def test_prefill_pool_is_sized_for_ttft_and_decode_pool_for_tpot() -> None:
    # One prompt takes 100 ms to prefill: a 1 s TTFT allows 10 queued; a 20 ms TPOT allows (20-5)/0.5 = 30.
    t = slo.compile_targets(Policy("p", ttft_ms=1000, tpot_ms=20), TP)
    assert (t.prefill, t.decode, t.aggregated) == (10, 30, 10)
    tighter = slo.compile_targets(Policy("p", ttft_ms=200, tpot_ms=8), TP)
    assert tighter.prefill == 2 and tighter.decode == 6


def test_targets_stay_within_bounds() -> None:
    t = slo.compile_targets(Policy("p", ttft_ms=1, tpot_ms=1), TP)
    assert (t.prefill, t.decode) == (1, 1)
    loose = slo.compile_targets(Policy("p", ttft_ms=10**6, tpot_ms=10**6), TP)
    assert loose.decode == TP.max_num_seqs


def test_sheddable_low_priority_traffic_is_shed_first() -> None:
    batch = slo.admission_for(Policy("batch", 5000, 200, priority=0, sheddable=True))
    mid = slo.admission_for(Policy("mid", 5000, 200, priority=50, sheddable=True))
    gold = slo.admission_for(Policy("gold", 300, 30, priority=90))
    assert batch.shed_threshold < mid.shed_threshold < gold.shed_threshold == 1.0
    assert not batch.admit(0.8) and mid.admit(0.8) and gold.admit(0.99) and not gold.admit(1.0)
    assert sorted([gold, mid, batch], key=lambda a: a.shed_order) == [batch, mid, gold]
    assert slo.admission_for(None) == slo.DEFAULT_ADMISSION


def test_admission_carries_the_policys_weight() -> None:
    assert slo.admission_for(Policy("heavy", 1000, 50, weight=2.5)).weight == 2.5
    assert slo.admission_for(Policy("plain", 1000, 50)).weight == 1.0
    assert slo.DEFAULT_ADMISSION.weight == 1.0
    t = uuid.uuid4()
    table = slo.AdmissionTable.build([(t, None, Policy("heavy", 1000, 50, weight=4))])
    assert table.admission_for(t, None).weight == 4.0
    assert table.admission_for(uuid.uuid4(), None).weight == 1.0


def test_admission_table_prefers_the_most_specific_assignment() -> None:
    t, other, model = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    table = slo.AdmissionTable.build([
        (t, None, Policy("tenant", 1000, 50)),
        (t, model, Policy("tenant-model", 500, 20)),
        (None, model, Policy("model", 2000, 100)),
    ])
    assert table.admission_for(t, model).slo_class == "tenant-model"
    assert table.admission_for(t, uuid.uuid4()).slo_class == "tenant"
    assert table.admission_for(other, model).slo_class == "model"
    assert table.admission_for(other, None).slo_class == "default"

"""Where a sent notification's time went, as the chaos report tells it (``chaos.reconcile``)."""

from __future__ import annotations

from chaos.reconcile import Reconciliation, _stages


def test_the_record_stage_is_the_time_from_the_providers_call_to_the_sent_record() -> None:
    rec = Reconciliation(accepted=1)
    history = [
        {"status": "accepted", "at": "2026-11-29T10:00:00.000000+00:00"},
        {"status": "queued", "at": "2026-11-29T10:00:00.100000+00:00"},
        {"status": "sending", "at": "2026-11-29T10:00:00.300000+00:00"},
        {"status": "sent", "at": "2026-11-29T10:00:00.950000+00:00"},
    ]
    accepted_s = 1_795_946_400.0  # 2026-11-29T10:00:00Z
    _stages(rec, accepted_s, history, accepted_s + 0.5)
    assert [round(v, 3) for v in rec.stages_s["publish"]] == [0.1]
    assert [round(v, 3) for v in rec.stages_s["consume"]] == [0.2]
    assert [round(v, 3) for v in rec.stages_s["send"]] == [0.2]
    assert [round(v, 3) for v in rec.stages_s["record"]] == [0.45]

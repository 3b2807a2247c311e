"""The account of a search stopped by a trial refused before its first training step (no Ray): free only when
nothing touched the data."""

from __future__ import annotations

import pytest

from ray_dptune import PointMass, TrialSpend
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.records.journal import JOURNAL_FILE, SearchJournal

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
DELTA = 1e-5
MECHANISM = SearchMechanism.random_count(law=PointMass(3), num_trials=3)
REFUSAL = "sample_rate 0.0769 (larger than the plan's 0.0588)"
FULL = SearchAccount(MECHANISM, delta=DELTA, plan=PLAN.to_dict()).guarantee().epsilon


def account(*events: dict) -> SearchAccount:
    built = SearchAccount(MECHANISM, delta=DELTA, plan=PLAN.to_dict())
    for event in events:
        built.apply(event)
    return built


def started(trial_id: str) -> list[dict]:
    return [
        {"type": "suggested", "trial_id": trial_id, "accounted": True},
        {"type": "started", "trial_id": trial_id, "accounted": True},
    ]


def refused(trial_id: str) -> list[dict]:
    return [*started(trial_id), {"type": "failed", "trial_id": trial_id, "untrained": REFUSAL}]


ENDED = {"type": "ended", "complete": False, "reason": "refused"}


def test_an_ended_search_whose_every_attempt_was_refused_untrained_spent_nothing():
    stopped = account(*refused("a"), *refused("b"), ENDED)
    assert stopped.refused_before_training()
    for guarantee in (stopped.guarantee(), stopped.guarantee(if_stopped_now=True), stopped.spent()):
        assert guarantee.epsilon == 0.0 and guarantee.curve is not None and not guarantee.curve.epsilons.any()
        assert REFUSAL in guarantee.reason


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([*refused("a")], id="not-ended-yet"),
        pytest.param([*refused("a"), *started("b"), ENDED], id="another-attempt-left-running"),
        pytest.param(
            [*refused("a"), *started("b"), {"type": "completed", "trial_id": "b"}, ENDED], id="another-trained"
        ),
        pytest.param(
            [
                *started("a"),
                {"type": "reported", "trial_id": "a", "spent": PLAN.to_dict()},
                {"type": "failed", "trial_id": "a", "untrained": REFUSAL},
                ENDED,
            ],
            id="refused-after-a-report",
        ),
        pytest.param([*started("a"), {"type": "failed", "trial_id": "a"}, ENDED], id="an-ordinary-failure"),
        pytest.param([ENDED], id="no-trial-at-all"),
        pytest.param([*refused("a"), ENDED, {"type": "restored"}, *started("b")], id="restored-and-running"),
        pytest.param(  # Ray may have built its actor (a class trainable's setup) before the start was heard
            [
                *refused("a"),
                {"type": "suggested", "trial_id": "b", "accounted": True},
                {"type": "interrupted", "trial_id": "b"},
                ENDED,
            ],
            id="another-only-suggested",
        ),
        pytest.param(
            [
                {"type": "suggested", "trial_id": "b", "accounted": True},
                *refused("a"),
                {"type": "failed", "trial_id": "b"},
                ENDED,
            ],
            id="another-failed-before-its-start-was-heard",
        ),
    ],
)
def test_the_search_is_charged_in_full_whenever_an_attempt_may_have_touched_the_data(events):
    charged = account(*events)
    assert not charged.refused_before_training()
    assert charged.guarantee().epsilon == pytest.approx(FULL, rel=1e-12) or charged.guarantee().epsilon > FULL


def test_the_journal_rebuilds_the_refusal(tmp_path):
    events = [*refused("a"), ENDED]
    written = SearchJournal(tmp_path / JOURNAL_FILE)
    record = {
        "mechanism": MECHANISM.to_dict(),
        "delta": DELTA,
        "plan": PLAN.to_dict(),
        "searcher": "RandomCountSearcher",
    }
    written.begin("s1", record, events[:2])
    written.append(events[2:])
    rebuilt = SearchJournal(tmp_path / JOURNAL_FILE).account()
    assert rebuilt.refused_before_training() and rebuilt.guarantee().epsilon == 0.0

"""Owed rows written a share at a time (analyzers/trickle.py): nothing waits
past its deadline, and a set that changes in step is not written at once."""
import random

from gpuscope.analyzers.trickle import Trickle


def test_every_call_writes_what_is_due_whatever_the_calls():
    rng = random.Random(7)
    t, tr = 0.0, Trickle(30.0)
    first: dict[int, float] = {}       # key -> when it first changed since last written
    for _ in range(5000):
        before, t = t, t + rng.choice([0.01, 0.3, 1.0, 4.0, 12.0])
        for k in rng.sample(range(300), rng.randrange(0, 40)):
            tr.add(k, (k, t), t)
            first.setdefault(k, t)
        for k, changed in tr.take(t):
            assert before - first.pop(k) < 30.0      # not already due at the call before
            assert changed <= t
        assert all(t - since < 30.0 for since in first.values())     # nothing due is left
    assert set(first) == {k for k, _ in tr.take_all()}


def test_a_fleet_changing_in_step_is_written_a_share_per_call():
    """10,000 items all change every 5 s; a call every 0.5 s writes about
    10,000 / 60 of them, never the whole fleet at once."""
    tr, t, sizes, last_written = Trickle(30.0), 0.0, [], {}
    for step in range(1200):
        t = step * 0.5
        if step % 10 == 0:
            for k in range(10_000):
                tr.add(k, k, t)
        got = tr.take(t)
        sizes.append(len(got))
        for k in got:
            assert t - last_written.get(k, 0.0) <= 30.0 + 5.0
            last_written[k] = t
    steady = sizes[120:]
    assert max(steady) < 1_000 and sum(steady) / len(steady) > 100
    assert len(last_written) == 10_000


def test_the_newest_value_is_written_and_put_back_is_due_at_once():
    tr = Trickle(30.0)
    tr.add("a", 1, 0.0)
    tr.add("a", 2, 10.0)
    assert "a" in tr and len(tr) == 1
    assert tr.take(11.0) == [] and tr.take(31.0) == [2]     # due 30 s after its first change
    tr.put_back({"b": 3}, 40.0)
    assert tr.take(40.0) == [3]
    tr.add("c", 4, 41.0)
    tr.discard("c")
    assert tr.take_all() == []


def test_one_item_asked_every_second_is_written_once_per_period():
    tr, writes = Trickle(30.0), 0
    for s in range(1, 301):
        tr.add("x", s, float(s))
        writes += len(tr.take(float(s)))
    assert 9 <= writes <= 11

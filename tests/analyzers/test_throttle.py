"""One log line per interval, with what happened in between counted into it."""
import threading

from gpuscope.analyzers.throttle import Throttle


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_the_first_hit_speaks_and_the_quiet_ones_are_counted_into_the_next_line():
    clock = Clock()
    th = Throttle(10.0, clock)
    assert th.hit(storms=1, anomalies=300) == {"storms": 1, "anomalies": 300}
    for _ in range(69):                      # 7 a second for ~10 s, as a fleet changing phase does
        clock.t += 0.14
        assert th.hit(storms=1, anomalies=250) is None
    clock.t += 0.5
    assert th.hit(storms=1, anomalies=10) == {"storms": 70, "anomalies": 69 * 250 + 10}
    clock.t += 30
    assert th.hit(storms=1, anomalies=5) == {"storms": 1, "anomalies": 5}


def test_no_hit_is_lost_across_threads():
    th, said = Throttle(0.0005), []
    lock = threading.Lock()

    def spam():
        for _ in range(5000):
            out = th.hit(refused=1)
            if out is not None:
                with lock:
                    said.append(out["refused"])

    threads = [threading.Thread(target=spam) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rest = th._held.get("refused", 0)
    assert sum(said) + rest == 20_000 and len(said) < 20_000

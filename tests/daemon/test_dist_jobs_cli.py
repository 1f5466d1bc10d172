"""`gpuscope capture --job` when the analyzer could ask none of the ranks."""
import argparse

from gpuscope.daemon import clients
from gpuscope.daemon.cmd_dist_jobs import cmd_capture_job


def test_a_job_whose_agents_are_not_connected_says_nothing_was_traced(monkeypatch, capsys):
    """Found in a trial: with no agent connected, the command printed an empty
    table and 'no collective seen in every rank's trace' (as if the ranks had
    been traced between steps)."""
    ranks = [dict(rank=str(r), host=f"node-{r // 2}", gpus=[r % 2], pid=100 + r, command=f"cc-g-r{r}", sent=False)
             for r in range(4)]
    monkeypatch.setattr(clients, "capture_job", lambda *a, **k: dict(group="g", start_at=1.8e9, ranks=ranks))
    asked_skew = []
    monkeypatch.setattr(clients, "job_skew", lambda *a, **k: asked_skew.append(a) or dict(captures=[]))
    ns = argparse.Namespace(server="x", job="jax:10.0.0.1:1234", duration_ms=2000, timeout=None, json=False,
                            insecure=True, tls_dir=None, ca=None, cert=None, key=None, token_file=None,
                            tls_server_name=None)
    monkeypatch.setattr("gpuscope.daemon.cmd_dist_jobs.client_security", lambda ns: None)
    assert cmd_capture_job(ns) == 1
    out = capsys.readouterr()
    assert "none of the 4 ranks of jax:10.0.0.1:1234 was asked" in out.err and "node-0, node-1" in out.err
    assert "nothing was traced" in out.err and "no collective seen" not in out.out
    assert not asked_skew
